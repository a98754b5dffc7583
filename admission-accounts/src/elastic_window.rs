//! [`ElasticWindow`]: a sliding-log rate window that stretches under pressure, with a circuit
//! breaker that refuses everyone while its upstream is down.
//!
//! The window admits `max_requests` requests in any stretch of `base_window` (a sliding log: one
//! stamp per request, counted while it is younger than the window). Each time the upstream
//! pushes back, the throttle rises by 1.0 and the window stretches to
//! `base_window x (1 + throttle)`, so the same number of requests is spread over more time;
//! successes bring it back down. When the upstream keeps failing although the throttle is at its
//! cap, the circuit breaker (Nygard's closed / open / half-open machine) opens: every caller is
//! refused at once with a message a model choosing tools can act on, until a cooldown has passed
//! and a single probe request, taken by the head of the line (the asker whose
//! [`Ask::is_head`] holds), has reported back.
//!
//! # The rule
//!
//! - **Window.** [`ask`](Account::ask) answers [`Answer::Taken`] (stamping `mine` at now, unless
//!   the ask is a [`look`](Ask::look)) when the requests inside the effective window plus `mine`
//!   plus the head's reservation ([`Ask::reserved_ahead`]) are at most `max_requests`. A demand
//!   above `max_requests` is [`Answer::Never`] outright, a
//!   [`RefusalKind::TooLarge`](admission_core::RefusalKind::TooLarge). Otherwise it is
//!   [`Answer::NotNow`] with the instant the k-th oldest stamp leaves the window, k being the
//!   shortfall (`None` when `mine` and the reservation together exceed `max_requests`).
//! - **Throttle.** [`record_failure`](ElasticWindow::record_failure),
//!   [`record_pressure`](ElasticWindow::record_pressure) and
//!   [`record_advisory_pressure`](ElasticWindow::record_advisory_pressure) add 1.0, up to the
//!   configured cap (9.0 by default). [`record_success`](ElasticWindow::record_success) takes 0.2
//!   off every `successes_per_decrease` successes (3 by default), or 0.5 off every success once
//!   five minutes have passed without pressure; never below zero. A relaxation calls
//!   the monitor's wake slot; a tightening does not (a deadline computed under the shorter window
//!   is merely re-asked early).
//! - **Circuit.** `failures_at_max_to_block` consecutive failures (3 by default), each arriving
//!   with the throttle already at its cap, open the circuit for `initial_cooldown`. While the
//!   cooldown runs, every caller gets an [`Answer::Never`] with a temporary refusal
//!   ([`RefusalKind::RefusingAll`](admission_core::RefusalKind::RefusingAll), the cooldown left
//!   as its retry-after) naming the window, its nominal rate, the cooldown left and the
//!   upstream's last failure, and telling it to use another tool. Then the head of the line, and
//!   only the head (an [`Ask`] whose [`is_head`](Ask::is_head) holds, never a waiter behind it,
//!   whatever its reservation), takes the one probe with a taking ask, subject to room in the
//!   window. A waiter behind a head that needs the window too is refused as though the probe
//!   were already out; a waiter behind a head that does not use the window (a zero reservation)
//!   is [`Answer::NotNow`] with no instant: the probe is for whoever asks as the head, which it
//!   may become. While the probe is out, everyone is refused. A success closes the
//!   circuit; a failure re-opens it with the cooldown doubled (kept within
//!   `[initial_cooldown, max_cooldown]`); a give while probing (the probe rolled back, no
//!   verdict) returns to blocked with the same cooldown, already over; a probe with no verdict
//!   after `probe_timeout` returns to blocked the same way. Opening calls the wake slot, so
//!   waiters parked on the window hear their refusal at once instead of at their deadline.
//!
//! Any success or failure while probing is taken as the probe's verdict, and any give while
//! probing as its refund: the window cannot tell one request from another.
//!
//!
//! Submodules: `log` (the stamps, run-length encoded, counted from where the window began at
//! the last count), `throttle` (the stretch, in exact thousandths), `circuit` (the breaker's
//! states) and `config` ([`ElasticWindowConfig`]).

mod circuit;
mod config;
mod log;
mod status;
mod throttle;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use admission_core::{
    Account, AccountStatus, Amount, Answer, Ask, Capability, Category, Clock, Instant, Refusal,
    Replenishment, SystemClock, WakeFn,
};
use parking_lot::{Mutex, MutexGuard};

use crate::ConfigError;

use circuit::{Circuit, Pass};
use log::Log;
use throttle::Throttle;

pub use config::ElasticWindowConfig;
pub use status::{CircuitState, ElasticWindowStatus};

/// The failure text [`ElasticWindow::record_pressure`] records.
const PRESSURE_TEXT: &str = "rate limited by the upstream";

/// The most characters of an upstream's failure text kept (and quoted in refusals).
pub(crate) const FAILURE_TEXT_LIMIT: usize = 200;

/// A sliding-log rate window with an adaptive throttle and a circuit breaker, as an [`Account`].
///
/// Reads only the primary dimension of an [`Amount`], as a number of requests. Capacity comes
/// back with time ([`Replenishment::Time`]): a request counts while its stamp is inside the
/// effective window, and a [`give`](Account::give) (a rollback) drops the newest stamps.
///
/// The rule, in full, is in the [module docs](self): what fits the window, how the throttle
/// moves, and the circuit's states.
///
/// Every window requires [`Capability::HTTP_CONNECTION`] in the same demand: a call to an
/// upstream needs a connection, so the monitor refuses a demand that names a window without an
/// HTTP connection gate ([`AdmitError::Unmet`](admission_core::AdmitError::Unmet)).
///
/// The name is the caller's to give (usually the upstream or tool the window guards); there is no
/// default derived from a type name.
///
/// All time is read from the one injected [`Clock`]: stamps, cooldowns, the probe's expiry and
/// the recovery interval.
///
/// # Fairness
///
/// The window is not a queue: an ask debits now or answers "not now". Order among waiters is
/// the monitor's (one line, head reservation); the probe goes to whoever asks as the head.
///
/// # Panics
///
/// Never. Counts and instants saturate; a give of more than is held empties the log; a window
/// longer than `u64::MAX` nanoseconds (about 584 years) counts as exactly that long.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use admission_accounts::elastic_window::{CircuitState, ElasticWindow, ElasticWindowConfig};
/// use admission_core::{Account, Amount, Answer, Ask, Instant, RefusalKind};
/// use admission_testkit::FakeClock;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let clock = FakeClock::new();
/// let config = ElasticWindowConfig::new(2, Duration::from_secs(10));
/// let search = ElasticWindow::new("search", config, clock.shared())?;
///
/// assert!(matches!(search.ask(Amount::ONE, Ask::HEAD), Answer::Taken));
/// clock.advance(Duration::from_secs(4));
/// assert!(matches!(search.ask(Amount::ONE, Ask::HEAD), Answer::Taken));
/// // Not now: two in the last 10 s, until the first stamp leaves the window.
/// let ten_s = Instant::from_nanos(10_000_000_000);
/// assert_eq!(search.ask(Amount::ONE, Ask::HEAD).not_now(), Some(Some(ten_s)));
/// // Never: two per window.
/// let never = search.ask(Amount::units(3), Ask::HEAD.look());
/// assert_eq!(
///     never.refusal().map(|r| r.kind()),
///     Some(RefusalKind::TooLarge { asked: Amount::units(3), max: Amount::units(2) })
/// );
///
/// search.record_pressure(); // the upstream pushed back: the window now spans 20 s
/// assert_eq!(search.effective_window(), Duration::from_secs(20));
/// assert_eq!(search.status_indicator().as_deref(), Some("throttle:2.0x"));
/// assert_eq!(search.circuit_state(), CircuitState::Healthy);
/// # Ok(())
/// # }
/// ```
pub struct ElasticWindow {
    /// The name events, statuses and refusals carry.
    name: String,
    /// The configuration, validated at construction and never changed.
    config: ElasticWindowConfig,
    /// `config.base_window` in nanoseconds, saturated to `u64::MAX`.
    base: u64,
    /// The window at the throttle's cap, in nanoseconds: stamps older than this can never count
    /// again and are forgotten.
    widest: u64,
    /// `config.resolved_probe_timeout()`.
    probe_timeout: Duration,
    /// The one clock every instant is read from.
    clock: Arc<dyn Clock>,
    /// Everything that changes, and the monitor's wake-up; see [`State`].
    state: Mutex<State>,
}

/// The window's moving parts, all behind one lock so a check and its debit are one step.
struct State {
    /// The latest instant any caller brought in; only ever raised, so time under this lock never
    /// goes back even when callers read the clock in a different order than they lock.
    now: Instant,
    /// The stamps; never more than `max_requests` requests, none older than `widest`.
    log: Log,
    /// The throttle; within `[0, max_throttle]`.
    throttle: Throttle,
    /// The effective window in nanoseconds: the base window stretched by `1 + throttle`
    /// (saturated). Recomputed by [`State::restretch`] after every move of the throttle, so the
    /// hot path never multiplies.
    window: u64,
    /// The breaker.
    circuit: Circuit,
    /// The upstream's last failure text, tidied and cut to 200 characters.
    last_failure: Option<String>,
    /// The monitor's wake-up, called when capacity grows (a give, a relaxation, the circuit
    /// closing) and when the circuit opens. Kept under the one lock and called while it is held
    /// (a [`WakeFn`] is cheap and never blocks, and may be called under an account's lock), so a
    /// give takes one lock, not a second one for a wake slot.
    wake: Option<WakeFn>,
}

impl State {
    /// Nothing taken, throttle zero, healthy, for a base window of `base` nanoseconds.
    fn fresh(config: &ElasticWindowConfig, base: u64) -> State {
        State {
            now: Instant::ZERO,
            log: Log::new(),
            throttle: Throttle::new(config.max_throttle),
            window: base,
            circuit: Circuit::new(config.initial_cooldown),
            last_failure: None,
            wake: None,
        }
    }

    /// Calls the monitor's wake-up, if one is installed.
    fn wake(&self) {
        if let Some(wake) = &self.wake {
            wake();
        }
    }

    /// Brings `window` in line with the throttle after it moved.
    fn restretch(&mut self, base: u64) {
        self.window = Throttle::stretch(base, self.throttle.milli());
    }
}

impl ElasticWindow {
    /// The category this family reports: a sliding-log rate window with a circuit breaker.
    pub const CATEGORY: Category = Category::custom("elastic_window");

    /// A window named `name` built from `config`, with nothing taken, reading `clock` (the
    /// monitor's: its stamps, cooldown and recovery interval are all read there).
    ///
    /// # Errors
    ///
    /// The [`ConfigError`] of [`ElasticWindowConfig::validate`]: the first field that cannot
    /// work, named, with the value seen.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_accounts::elastic_window::{ElasticWindow, ElasticWindowConfig};
    /// use admission_core::{Account, Amount, Answer, Ask};
    /// use admission_testkit::FakeClock;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let clock = FakeClock::new();
    /// let config = ElasticWindowConfig::new(1, Duration::from_secs(1));
    /// let search = ElasticWindow::new("search", config, clock.shared())?;
    /// assert!(matches!(search.ask(Amount::ONE, Ask::HEAD), Answer::Taken));
    /// clock.advance(Duration::from_secs(1)); // the stamp leaves the window
    /// assert!(matches!(search.ask(Amount::ONE, Ask::HEAD), Answer::Taken));
    ///
    /// let config = ElasticWindowConfig::new(60, Duration::from_secs(60)).with_max_throttle(-1.0);
    /// let refused = ElasticWindow::new("search", config, clock.shared()).unwrap_err();
    /// assert_eq!(refused.field, "max_throttle");
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(
        name: impl Into<String>,
        config: ElasticWindowConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<ElasticWindow, ConfigError> {
        config.validate()?;
        let base = nanos(config.base_window);
        let widest = Throttle::stretch(base, Throttle::new(config.max_throttle).max_milli());
        Ok(ElasticWindow {
            name: name.into(),
            base,
            widest,
            probe_timeout: config.resolved_probe_timeout(),
            clock,
            state: Mutex::new(State::fresh(&config, base)),
            config,
        })
    }

    /// A window named `name` built from `config` on the operating system's clock.
    ///
    /// The instants of its [`Answer::NotNow`] are then on the system clock's scale, which is
    /// the monitor's when the monitor runs on the system clock too.
    ///
    /// # Errors
    ///
    /// As [`ElasticWindow::new`].
    pub fn on_system_clock(
        name: impl Into<String>,
        config: ElasticWindowConfig,
    ) -> Result<ElasticWindow, ConfigError> {
        ElasticWindow::new(name, config, Arc::new(SystemClock::new()))
    }

    /// The window's name.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_accounts::elastic_window::{ElasticWindow, ElasticWindowConfig};
    ///
    /// let w = ElasticWindow::on_system_clock("search", ElasticWindowConfig::new(5, Duration::from_secs(1))).unwrap();
    /// assert_eq!(w.name(), "search");
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The configuration the window was built from.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_accounts::elastic_window::{ElasticWindow, ElasticWindowConfig};
    ///
    /// let w = ElasticWindow::on_system_clock("search", ElasticWindowConfig::new(5, Duration::from_secs(1))).unwrap();
    /// assert_eq!(w.config().max_requests, 5);
    /// ```
    pub fn config(&self) -> &ElasticWindowConfig {
        &self.config
    }

    /// Requests counted by the effective window now.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_accounts::elastic_window::{ElasticWindow, ElasticWindowConfig};
    /// use admission_core::{Account, Amount, Answer, Ask};
    /// use admission_testkit::FakeClock;
    ///
    /// let clock = FakeClock::new();
    /// let w = ElasticWindow::new("search", ElasticWindowConfig::new(5, Duration::from_secs(1)), clock.shared())
    ///     .unwrap();
    /// assert!(matches!(w.ask(Amount::units(3), Ask::HEAD), Answer::Taken));
    /// assert_eq!(w.in_use(), 3);
    /// clock.advance(Duration::from_secs(1));
    /// assert_eq!(w.in_use(), 0);
    /// ```
    pub fn in_use(&self) -> u64 {
        let (mut st, now) = self.lock_now();
        let window = st.window;
        st.log.in_use(now, window)
    }

    /// The effective window now: the base window times `1 + throttle`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_accounts::elastic_window::{ElasticWindow, ElasticWindowConfig};
    ///
    /// let w = ElasticWindow::on_system_clock("search", ElasticWindowConfig::new(5, Duration::from_secs(10))).unwrap();
    /// w.record_advisory_pressure();
    /// assert_eq!(w.effective_window(), Duration::from_secs(20));
    /// ```
    pub fn effective_window(&self) -> Duration {
        let (st, _) = self.lock_now();
        Duration::from_nanos(st.window)
    }

    /// The throttle now, between 0 and the configured maximum.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_accounts::elastic_window::{ElasticWindow, ElasticWindowConfig};
    ///
    /// let w = ElasticWindow::on_system_clock("search", ElasticWindowConfig::new(5, Duration::from_secs(10))).unwrap();
    /// w.record_pressure();
    /// w.record_pressure();
    /// assert_eq!(w.throttle(), 2.0);
    /// for _ in 0..3 {
    ///     w.record_success();
    /// }
    /// assert_eq!(w.throttle(), 1.8);
    /// ```
    pub fn throttle(&self) -> f64 {
        let (st, _) = self.lock_now();
        milli_to_f64(st.throttle.milli())
    }

    /// The circuit breaker's state now.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_accounts::elastic_window::{CircuitState, ElasticWindow, ElasticWindowConfig};
    ///
    /// let config = ElasticWindowConfig::new(5, Duration::from_secs(10)).with_max_throttle(0.0);
    /// let w = ElasticWindow::on_system_clock("search", config).unwrap();
    /// for _ in 0..3 {
    ///     w.record_failure("HTTP 503");
    /// }
    /// assert_eq!(w.circuit_state(), CircuitState::Blocked);
    /// ```
    pub fn circuit_state(&self) -> CircuitState {
        let (st, _) = self.lock_now();
        st.circuit.state()
    }

    /// Time left before a blocked circuit offers its probe; zero unless blocked.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_accounts::elastic_window::{ElasticWindow, ElasticWindowConfig};
    /// use admission_testkit::FakeClock;
    ///
    /// let clock = FakeClock::new();
    /// let config = ElasticWindowConfig::new(5, Duration::from_secs(10)).with_max_throttle(0.0);
    /// let w = ElasticWindow::new("search", config, clock.shared()).unwrap();
    /// assert_eq!(w.cooldown_remaining(), Duration::ZERO);
    /// for _ in 0..3 {
    ///     w.record_failure("HTTP 503");
    /// }
    /// clock.advance(Duration::from_secs(10));
    /// assert_eq!(w.cooldown_remaining(), Duration::from_secs(20));
    /// ```
    pub fn cooldown_remaining(&self) -> Duration {
        let (st, now) = self.lock_now();
        st.circuit.cooldown_remaining(now)
    }

    /// The cooldown the circuit blocked with last: the initial cooldown until a probe fails, then
    /// doubled per failed probe up to the maximum, and back to the initial one when the circuit
    /// closes.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_accounts::elastic_window::{ElasticWindow, ElasticWindowConfig};
    ///
    /// let w = ElasticWindow::on_system_clock("search", ElasticWindowConfig::new(5, Duration::from_secs(10))).unwrap();
    /// assert_eq!(w.cooldown(), Duration::from_secs(30));
    /// ```
    pub fn cooldown(&self) -> Duration {
        let (st, _) = self.lock_now();
        st.circuit.cooldown()
    }

    /// The upstream's last failure text as recorded (tidied, at most 200
    /// characters); `None` before the first failure.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_accounts::elastic_window::{ElasticWindow, ElasticWindowConfig};
    ///
    /// let w = ElasticWindow::on_system_clock("search", ElasticWindowConfig::new(5, Duration::from_secs(10))).unwrap();
    /// assert_eq!(w.last_failure(), None);
    /// w.record_failure("HTTP 502\n  Bad Gateway");
    /// assert_eq!(w.last_failure().as_deref(), Some("HTTP 502 Bad Gateway"));
    /// ```
    pub fn last_failure(&self) -> Option<String> {
        self.state.lock().last_failure.clone()
    }

    /// How many times the circuit has opened since the window was built (from healthy, or again
    /// after a failed probe).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_accounts::elastic_window::{ElasticWindow, ElasticWindowConfig};
    ///
    /// let config = ElasticWindowConfig::new(5, Duration::from_secs(10)).with_max_throttle(0.0);
    /// let w = ElasticWindow::on_system_clock("search", config).unwrap();
    /// for _ in 0..10 {
    ///     w.record_failure("HTTP 503"); // once open, more failures change nothing
    /// }
    /// assert_eq!(w.circuit_openings(), 1);
    /// ```
    pub fn circuit_openings(&self) -> u64 {
        self.state.lock().circuit.openings()
    }

    /// The upstream answered a request: the failure streak ends, the throttle relaxes by its
    /// rule, and a probe's success closes the circuit. Calls the wake slot when the throttle went
    /// down or the circuit closed.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_accounts::elastic_window::{ElasticWindow, ElasticWindowConfig};
    /// use admission_testkit::FakeClock;
    ///
    /// let clock = FakeClock::new();
    /// let w = ElasticWindow::new("search", ElasticWindowConfig::new(5, Duration::from_secs(10)), clock.shared())
    ///     .unwrap();
    /// w.record_pressure();
    /// w.record_success();
    /// w.record_success();
    /// assert_eq!(w.throttle(), 1.0); // a round is three successes
    /// w.record_success();
    /// assert_eq!(w.throttle(), 0.8);
    /// clock.advance(Duration::from_secs(5 * 60)); // five minutes without pressure
    /// w.record_success();
    /// assert_eq!(w.throttle(), 0.3); // long after the pressure, every success takes 0.5
    /// ```
    pub fn record_success(&self) {
        let (mut st, now) = self.lock_now();
        let relaxed = st.throttle.relax(now, self.config.successes_per_decrease);
        if relaxed {
            st.restretch(self.base);
        }
        let closed = st.circuit.succeed(self.config.initial_cooldown);
        let throttle = st.throttle.milli();
        if relaxed || closed {
            st.wake();
        }
        drop(st);
        if closed {
            tracing::info!(limiter = %self.name, "elastic window circuit closed: the probe succeeded");
        }
        if relaxed {
            tracing::debug!(limiter = %self.name, throttle = milli_to_f64(throttle), "elastic window relaxed");
        }
    }

    /// The upstream failed a request with `description` (its status line, its error message):
    /// the throttle rises by 1.0, the text is kept for refusals, and the failure counts toward
    /// opening the circuit when the throttle already stood at its cap. While probing, this is the
    /// probe's failure: the circuit re-opens with the cooldown doubled.
    ///
    /// The text is tidied (runs of whitespace become one space) and cut to
    /// 200 characters, so an upstream's whole error page never ends up in a
    /// refusal. Opening the circuit calls the wake slot, so parked waiters are refused at once.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_accounts::elastic_window::{CircuitState, ElasticWindow, ElasticWindowConfig};
    ///
    /// let config = ElasticWindowConfig::new(5, Duration::from_secs(10)).with_max_throttle(1.0);
    /// let w = ElasticWindow::on_system_clock("search", config).unwrap();
    /// w.record_failure("HTTP 503"); // brings the throttle to its cap: not yet "at" it
    /// w.record_failure("HTTP 503");
    /// w.record_failure("HTTP 503");
    /// assert_eq!(w.circuit_state(), CircuitState::Healthy);
    /// w.record_failure("HTTP 503 Service Unavailable");
    /// assert_eq!(w.circuit_state(), CircuitState::Blocked);
    /// ```
    pub fn record_failure(&self, description: &str) {
        let text = tidy(description);
        let (mut st, now) = self.lock_now();
        let at_max = st.throttle.at_max();
        st.throttle.press(now);
        st.restretch(self.base);
        st.last_failure = Some(text.clone());
        let opened = st.circuit.fail(
            now,
            at_max,
            self.config.failures_at_max_to_block,
            self.config.initial_cooldown,
            self.config.max_cooldown,
        );
        let cooldown = st.circuit.cooldown();
        if opened {
            st.wake();
        }
        drop(st);
        if opened {
            tracing::warn!(
                limiter = %self.name,
                cooldown = ?cooldown,
                last_failure = %text,
                "elastic window circuit opened: refusing every call until the cooldown ends"
            );
        }
    }

    /// The upstream pushed back without saying more (an HTTP 429): the same as
    /// [`record_failure`](ElasticWindow::record_failure) with the text "rate limited by the
    /// upstream".
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_accounts::elastic_window::{ElasticWindow, ElasticWindowConfig};
    ///
    /// let w = ElasticWindow::on_system_clock("search", ElasticWindowConfig::new(5, Duration::from_secs(10))).unwrap();
    /// w.record_pressure();
    /// assert_eq!(w.throttle(), 1.0);
    /// assert_eq!(w.last_failure().as_deref(), Some("rate limited by the upstream"));
    /// ```
    pub fn record_pressure(&self) {
        self.record_failure(PRESSURE_TEXT);
    }

    /// A hint to slow down that is not a failure (a low remaining-quota header): the throttle
    /// rises by 1.0, up to its cap, and nothing else changes. It never counts toward opening the
    /// circuit and never calls the wake slot.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_accounts::elastic_window::{CircuitState, ElasticWindow, ElasticWindowConfig};
    ///
    /// let config = ElasticWindowConfig::new(5, Duration::from_secs(10)).with_max_throttle(2.0);
    /// let w = ElasticWindow::on_system_clock("search", config).unwrap();
    /// for _ in 0..10 {
    ///     w.record_advisory_pressure();
    /// }
    /// assert_eq!(w.throttle(), 2.0);
    /// assert_eq!(w.circuit_state(), CircuitState::Healthy);
    /// ```
    pub fn record_advisory_pressure(&self) {
        let (mut st, now) = self.lock_now();
        st.throttle.press(now);
        st.restretch(self.base);
    }

    /// The status record read now, typed (what [`Account::status`] boxes).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_accounts::elastic_window::{CircuitState, ElasticWindow, ElasticWindowConfig};
    /// use admission_core::{Account, Amount, Answer, Ask};
    ///
    /// let w = ElasticWindow::on_system_clock("search", ElasticWindowConfig::new(5, Duration::from_secs(10))).unwrap();
    /// assert!(matches!(w.ask(Amount::units(2), Ask::HEAD), Answer::Taken));
    /// let status = w.status_record();
    /// assert_eq!((status.in_use, status.max_requests), (2, 5));
    /// assert_eq!(status.circuit, CircuitState::Healthy);
    /// ```
    pub fn status_record(&self) -> ElasticWindowStatus {
        let (mut st, now) = self.lock_now();
        let window = st.window;
        ElasticWindowStatus {
            name: self.name.clone(),
            max_requests: self.config.max_requests,
            base_window: self.config.base_window,
            effective_window: Duration::from_nanos(window),
            in_use: st.log.in_use(now, window),
            throttle: milli_to_f64(st.throttle.milli()),
            circuit: st.circuit.state(),
            cooldown_remaining: st.circuit.cooldown_remaining(now),
        }
    }

    /// Reads the clock, then locks the state and brings it up to that instant: time under the
    /// lock never goes back, a probe past its timeout is given up, and stamps no window can
    /// count any more are forgotten.
    #[inline]
    fn lock_now(&self) -> (MutexGuard<'_, State>, Instant) {
        self.lock_at(self.clock.now())
    }

    /// [`lock_now`](Self::lock_now) at `read`, an instant the caller was given.
    #[inline]
    fn lock_at(&self, read: Instant) -> (MutexGuard<'_, State>, Instant) {
        let mut st = self.state.lock();
        let now = read.max(st.now);
        st.now = now;
        if st.circuit.expire_probe(now) {
            tracing::debug!(limiter = %self.name, "elastic window probe expired without a verdict");
        }
        st.log.expire(now, self.widest);
        (st, now)
    }

    /// The "never" of `mine`, a demand above `max_requests`, if it is one.
    fn too_large(&self, mine: Amount) -> Option<Refusal> {
        let asked = mine.primary();
        let max = self.config.max_requests;
        (asked > max).then(|| {
            Refusal::too_large(mine, Amount::units(max)).with_message(format!(
                "The rate limiter `{}` allows at most {}; a demand of {asked} requests can never \
                 fit. Ask for at most {max} requests at a time.",
                self.name,
                self.rate()
            ))
        })
    }

    /// The refusal while the cooldown runs.
    fn blocked_refusal(&self, st: &State, left: Duration) -> Refusal {
        Refusal::temporary(
            format!(
                "The rate limiter `{}` ({}) is refusing every call for another {}: its upstream \
             kept failing, so its circuit breaker is open. The upstream's last failure: {}. Do \
             not wait for this tool; pick another tool to continue.",
                self.name,
                self.rate(),
                remaining(left),
                last_failure_text(st)
            ),
            left,
        )
    }

    /// The refusal while the probe is out, or is about to be the head's.
    fn probe_refusal(&self, st: &State) -> Refusal {
        Refusal::temporary(
            format!(
                "The rate limiter `{}` ({}) is refusing every call while a single trial call checks \
             whether its upstream has recovered: its upstream kept failing, so its circuit \
             breaker is open. The upstream's last failure: {}. Do not wait for this tool; pick \
             another tool to continue.",
                self.name,
                self.rate(),
                last_failure_text(st)
            ),
            self.probe_timeout,
        )
    }

    /// The nominal rate: "60 requests per 60 s".
    fn rate(&self) -> String {
        let max = self.config.max_requests;
        let unit = if max == 1 { "request" } else { "requests" };
        format!("{max} {unit} per {}", span(self.config.base_window))
    }
}

impl Account for ElasticWindow {
    fn name(&self) -> &str {
        &self.name
    }

    fn category(&self) -> Category {
        ElasticWindow::CATEGORY
    }

    /// Always [`Replenishment::Time`]: a request keeps counting after the call that made it has
    /// finished, until its stamp leaves the window.
    fn replenishment(&self) -> Replenishment {
        Replenishment::Time
    }

    /// The requests the window admits at most (`max_requests`).
    fn capacity(&self) -> Option<Amount> {
        Some(Amount::units(self.config.max_requests))
    }

    /// One lock: the breaker's word for this asker, then the window's room for `mine` beside the
    /// head's reservation. A taking ask that fits stamps `mine` at now; the head's claims the
    /// circuit's probe when the cooldown is over.
    fn ask(&self, mine: Amount, ask: Ask) -> Answer {
        if let Some(refusal) = self.too_large(mine) {
            return Answer::Never(refusal);
        }
        let reserved = ask.reserved_ahead().primary();
        let head_uses_it = !ask.head_reserved().is_zero();
        let (mut st, now) = self.lock_at(ask.now(&*self.clock));
        let probe = match st.circuit.pass(now, ask.is_head()) {
            Pass::Open => false,
            Pass::Probe => true,
            Pass::Cooling(left) => return Answer::Never(self.blocked_refusal(&st, left)),
            Pass::ProbeOut => return Answer::Never(self.probe_refusal(&st)),
            // The probe is the head's. A head that needs this window will take it, so a waiter
            // behind it is refused as though it were out already; a head that does not use the
            // window leaves it to whoever asks as the head, which this waiter may become.
            Pass::HeadsProbe if head_uses_it => return Answer::Never(self.probe_refusal(&st)),
            Pass::HeadsProbe => return Answer::NotNow(None),
        };
        let max = self.config.max_requests;
        let asked = mine.primary();
        let window = st.window;
        let want = st
            .log
            .in_use(now, window)
            .saturating_add(asked)
            .saturating_add(reserved);
        if want <= max {
            if ask.takes() {
                st.log.push(now, asked, max);
                if probe {
                    st.circuit.claim_probe(now, self.probe_timeout);
                    drop(st);
                    tracing::info!(limiter = %self.name, "elastic window probe sent: the circuit is half open");
                }
            }
            return Answer::Taken;
        }
        if asked.saturating_add(reserved) > max {
            // Time alone never makes room for more than a whole window.
            return Answer::NotNow(None);
        }
        // The k-th oldest stamp leaving the window makes room for a shortfall of k.
        Answer::NotNow(
            st.log
                .kth_leaves(now, window, want - max)
                .map(|at| at.max(now)),
        )
    }

    /// Drops the newest `amount` stamps (the oldest, which deadlines read, stay). While probing,
    /// this is the probe rolled back without a verdict: the circuit returns to blocked, its
    /// cooldown kept. Calls the wake slot when anything changed.
    fn give(&self, amount: Amount) {
        let n = amount.primary();
        if n == 0 {
            return;
        }
        // No clock read: dropping the newest stamps needs no time, and a refund reverts a probe
        // to the same blocked state its expiry would.
        let mut st = self.state.lock();
        let dropped = st.log.drop_newest(n);
        let reverted = st.circuit.refund();
        if dropped > 0 || reverted {
            st.wake();
        }
        drop(st);
        if reverted {
            tracing::debug!(limiter = %self.name, "elastic window probe refunded without a verdict");
        }
    }

    fn status(&self) -> Box<dyn AccountStatus> {
        Box::new(self.status_record())
    }

    /// `blocked` or `probing` while the circuit is not healthy, else `throttle:<1 + throttle>x`
    /// with one decimal while throttled, else `None`: what the status record's indicator says.
    fn status_indicator(&self) -> Option<String> {
        let (st, _) = self.lock_now();
        match st.circuit.state() {
            CircuitState::Healthy => {
                let milli = st.throttle.milli();
                (milli > 0).then(|| format!("throttle:{:.1}x", 1.0 + milli_to_f64(milli)))
            }
            state => Some(state.as_str().to_owned()),
        }
    }

    /// Installs or clears the wake-up under the one lock; the callback replaced is dropped
    /// after the lock is released.
    fn on_capacity_change(&self, wake: Option<WakeFn>) {
        let replaced = std::mem::replace(&mut self.state.lock().wake, wake);
        drop(replaced);
    }
    /// Clears the wake-up if it is `wake` (compared by address); one installed by someone else
    /// since is left alone.
    fn forget_capacity_change(&self, wake: &WakeFn) {
        let mut st = self.state.lock();
        let cleared = if st.wake.as_ref().is_some_and(|held| Arc::ptr_eq(held, wake)) {
            st.wake.take()
        } else {
            None
        };
        drop(st);
        drop(cleared);
    }

    /// Always [`Capability::HTTP_CONNECTION`]: a call to the upstream needs a connection.
    fn requires(&self) -> Option<Capability> {
        Some(Capability::HTTP_CONNECTION)
    }
}

impl fmt::Debug for ElasticWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ElasticWindow")
            .field("name", &self.name)
            .field("config", &self.config)
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

/// A duration in nanoseconds, saturated to `u64::MAX`.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Thousandths as a number.
fn milli_to_f64(milli: u64) -> f64 {
    milli as f64 / throttle::MILLI as f64
}

/// The last failure for a refusal.
fn last_failure_text(st: &State) -> &str {
    st.last_failure.as_deref().unwrap_or("not described")
}

/// A configured duration written exactly in the largest unit that divides it: `60 s`,
/// `250 ms`, `15 µs`, `7 ns`.
fn span(d: Duration) -> String {
    let n = d.as_nanos();
    if n == 0 {
        "0 s".to_owned()
    } else if n.is_multiple_of(1_000_000_000) {
        format!("{} s", n / 1_000_000_000)
    } else if n.is_multiple_of(1_000_000) {
        format!("{} ms", n / 1_000_000)
    } else if n.is_multiple_of(1_000) {
        format!("{} µs", n / 1_000)
    } else {
        format!("{n} ns")
    }
}

/// Time left, rounded up: whole seconds from one second on (`30 s`), else whole milliseconds
/// (`250 ms`, at least `1 ms`).
fn remaining(d: Duration) -> String {
    let n = d.as_nanos();
    if n >= 1_000_000_000 {
        format!("{} s", n.div_ceil(1_000_000_000))
    } else {
        format!("{} ms", n.div_ceil(1_000_000).max(1))
    }
}

/// An upstream's failure text, fit for a one-line refusal: whitespace runs become one space,
/// and the text is cut to 200 characters, `...` marking a cut.
fn tidy(text: &str) -> String {
    let mut out = String::new();
    for (i, word) in text.split_whitespace().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(word);
    }
    if out.chars().count() > FAILURE_TEXT_LIMIT {
        let mut cut: String = out.chars().take(FAILURE_TEXT_LIMIT).collect();
        cut.push_str("...");
        cut
    } else {
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_written_for_a_reader() {
        assert_eq!(span(Duration::from_secs(60)), "60 s");
        assert_eq!(span(Duration::from_millis(1_500)), "1500 ms");
        assert_eq!(span(Duration::from_micros(15)), "15 µs");
        assert_eq!(span(Duration::from_nanos(7)), "7 ns");
        assert_eq!(remaining(Duration::from_millis(29_001)), "30 s");
        assert_eq!(remaining(Duration::from_nanos(1)), "1 ms");
        assert_eq!(remaining(Duration::from_micros(250_500)), "251 ms");
    }

    #[test]
    fn failure_text_is_tidied_and_cut() {
        assert_eq!(tidy("  HTTP 502\n\tBad   Gateway "), "HTTP 502 Bad Gateway");
        let long = "é".repeat(FAILURE_TEXT_LIMIT + 5);
        let cut = tidy(&long);
        assert_eq!(cut.chars().count(), FAILURE_TEXT_LIMIT + 3);
        assert!(cut.ends_with("..."));
    }
}
