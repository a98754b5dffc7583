//! What the layer says when a request is not admitted: [`Refused`] (with its [`Reason`],
//! [`retry_after`](Refused::retry_after) and, for a demand that can never fit, [`NeverFits`]),
//! [`AdmissionError`] around the inner service's own errors, [`DemandError`] for a request no
//! demand can be built from, and the [`Waited`] extension an admitted request carries.

use std::fmt;
use std::time::Duration;

use admission_core::{AdmitError, Amount, RefusalKind};

use crate::retry::{LineFull, RetryAfter};

/// How long a request waited for its grant, on the monitor's clock; zero when granted on
/// arrival. Every admitted request carries it as a request extension.
///
/// # Examples
///
/// ```
/// use admission_tower::Waited;
///
/// async fn handler(request: http::Request<String>) -> String {
///     let waited = request.extensions().get::<Waited>().map_or(0, |w| w.0.as_millis());
///     format!("waited {waited} ms")
/// }
/// # drop(handler(http::Request::new(String::new())));
/// ```
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Waited(pub std::time::Duration);

/// The request's demand could not be built from the request: a malformed header, a body size
/// past what the service takes, a spend cap already spent. The request is refused without
/// waiting, and the inner service is not called.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct DemandError {
    quota: bool,
    message: String,
    retry_after: Option<Duration>,
}

impl DemandError {
    /// The request itself is wrong (HTTP 400, gRPC `INVALID_ARGUMENT`).
    pub fn invalid(message: impl Into<String>) -> DemandError {
        DemandError {
            quota: false,
            message: message.into(),
            retry_after: None,
        }
    }

    /// The caller's quota is spent (HTTP 429, gRPC `RESOURCE_EXHAUSTED`), until `retry_after`
    /// when known.
    pub fn quota(message: impl Into<String>, retry_after: Option<Duration>) -> DemandError {
        DemandError {
            quota: true,
            message: message.into(),
            retry_after,
        }
    }

    /// True for [`DemandError::quota`].
    pub fn is_quota(&self) -> bool {
        self.quota
    }

    /// When a spent quota expects to accept again, if known.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }
}

/// Why a request was refused, as the status mappings read it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// The layer's timeout passed while the request waited.
    TimedOut,
    /// An account refuses everyone for now (an open circuit); it says when to retry.
    CircuitOpen,
    /// A quota is spent: an account the layer was told is a quota refused
    /// ([`AdmissionLayer::quota_account`](crate::AdmissionLayer::quota_account)), or the demand
    /// function said so ([`DemandError::quota`]). A demand more than such an account can ever
    /// grant at once is [`TooLarge`](Reason::TooLarge) instead.
    Quota,
    /// The demand can never fit an account as configured ([`Refused::never_fits`] has the
    /// numbers): what the request declares it needs is more than the account can ever grant
    /// (HTTP 422). Retrying the same request cannot help.
    TooLarge,
    /// The demand can never fit an account that counts bytes
    /// ([`AdmissionLayer::bytes_account`](crate::AdmissionLayer::bytes_account)): the request's
    /// body is what is too large (HTTP 413). Retrying the same request cannot help.
    TooLargeBytes,
    /// No demand could be built from the request ([`DemandError::invalid`]).
    Invalid,
    /// The line was past the layer's [`LineBound`](crate::LineBound) when the request arrived
    /// (refused at once, without waiting), or could no longer serve it within the bound while
    /// it waited ([`Cause::Shed`] says how long the line was).
    Shed,
    /// The job was cancelled through its context.
    Cancelled,
    /// Admission itself failed or ended: the monitor was stopped or closed by a defect, an
    /// account panicked, or its evaluator could not start.
    Unavailable,
    /// The demand lacks an account another one requires, or the job names a priority level the
    /// monitor does not have: the service is built wrong.
    Misconfigured,
}

impl Reason {
    /// The reason's wire name (`timed_out`, `circuit_open`, `quota`, ...).
    pub fn as_str(&self) -> &'static str {
        match self {
            Reason::TimedOut => "timed_out",
            Reason::CircuitOpen => "circuit_open",
            Reason::Quota => "quota",
            Reason::TooLarge => "too_large",
            Reason::TooLargeBytes => "too_large_bytes",
            Reason::Invalid => "invalid",
            Reason::Shed => "shed",
            Reason::Cancelled => "cancelled",
            Reason::Unavailable => "unavailable",
            Reason::Misconfigured => "misconfigured",
        }
    }

    /// Whether the same request, sent again later, may be admitted: false for a demand that can
    /// never fit, a request no demand can be built from, and a service built wrong.
    pub fn is_retryable(&self) -> bool {
        !matches!(
            self,
            Reason::TooLarge | Reason::TooLargeBytes | Reason::Invalid | Reason::Misconfigured
        )
    }

    /// Whether the layer estimates a retry time for this reason when the refusal has none of its
    /// own: the refusals of the monitor's line ([`TimedOut`](Reason::TimedOut),
    /// [`Shed`](Reason::Shed), [`Cancelled`](Reason::Cancelled),
    /// [`Unavailable`](Reason::Unavailable), and [`CircuitOpen`](Reason::CircuitOpen), which
    /// always has its own).
    fn is_estimated(&self) -> bool {
        matches!(
            self,
            Reason::TimedOut
                | Reason::Shed
                | Reason::Cancelled
                | Reason::Unavailable
                | Reason::CircuitOpen
        )
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What refused the request: the monitor, the demand function before it, or the layer's line
/// bound.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Cause {
    /// The monitor's refusal.
    #[error(transparent)]
    Admit(AdmitError),
    /// The demand function's.
    #[error(transparent)]
    Demand(DemandError),
    /// The layer's: the line was past its [`LineBound`](crate::LineBound).
    #[error(transparent)]
    Shed(LineFull),
}

/// A request that was not admitted: why, what said so, how long it waited first, and when it
/// may try again.
///
/// Carried by [`AdmissionError::Refused`], and inserted into a refusal response's extensions
/// when refusals are mapped to responses.
#[derive(Clone, Debug, thiserror::Error)]
#[error("request refused ({reason}) after waiting {waited:?}: {cause}")]
pub struct Refused {
    reason: Reason,
    waited: Duration,
    #[source]
    cause: Cause,
    /// The layer's estimate, when the cause knows no instant and the reason is estimated.
    estimate: Option<Duration>,
}

/// A demand that can never fit one account as it is configured: which account, and the numbers
/// when the account gave them. From [`Refused::never_fits`].
///
/// Its `Display` is one line naming the account, what was asked, what the account can ever
/// grant at once, and the account's own words: what the `http` mapping writes in a 413 or 422
/// body, and the `grpc` mapping in `grpc-message`.
///
/// # Examples
///
/// ```
/// use admission_core::{AdmitError, Amount, Refusal};
/// use admission_tower::NeverFits;
///
/// let error = AdmitError::Refused {
///     account: "workers".into(),
///     refusal: Refusal::too_large(Amount::units(5), Amount::units(2)),
/// };
/// let never = NeverFits::from_error(&error).unwrap();
/// assert_eq!((never.asked(), never.capacity()), (Some(Amount::units(5)), Some(Amount::units(2))));
/// assert_eq!(
///     never.to_string(),
///     "account `workers` asked 5, capacity 2: asks 5, more than the 2 it can ever grant at once",
/// );
/// ```
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct NeverFits<'a> {
    account: &'a str,
    asked: Option<Amount>,
    capacity: Option<Amount>,
    message: &'a str,
}

impl<'a> NeverFits<'a> {
    /// The facts of `error` when it says a demand can never fit an account: a refusal that is
    /// not a temporary one. `None` for every other error.
    pub fn from_error(error: &'a AdmitError) -> Option<NeverFits<'a>> {
        let AdmitError::Refused { account, refusal } = error else {
            return None;
        };
        let (asked, capacity) = match refusal.kind() {
            RefusalKind::TooLarge { asked, max } => (Some(asked), Some(max)),
            RefusalKind::RefusingAll { .. } => return None,
            _ => (None, None),
        };
        Some(NeverFits {
            account,
            asked,
            capacity,
            message: refusal.message(),
        })
    }

    /// The account the demand can never fit.
    pub fn account(&self) -> &'a str {
        self.account
    }

    /// What the demand asked of it, when the account said.
    pub fn asked(&self) -> Option<Amount> {
        self.asked
    }

    /// The most the account can ever grant at once, when it said.
    pub fn capacity(&self) -> Option<Amount> {
        self.capacity
    }

    /// The account's own words.
    pub fn message(&self) -> &'a str {
        self.message
    }
}

impl fmt::Display for NeverFits<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "account `{}`", self.account)?;
        if let (Some(asked), Some(capacity)) = (self.asked, self.capacity) {
            write!(f, " asked {asked}, capacity {capacity}")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// The accounts the layer was told count bytes or are quotas: how a refusal is classified.
#[derive(Clone, Debug, Default)]
pub(crate) struct Accounts {
    pub(crate) bytes: Vec<String>,
    pub(crate) quotas: Vec<String>,
}

impl Accounts {
    fn is_bytes(&self, account: &str) -> bool {
        self.bytes.iter().any(|a| a == account)
    }

    fn is_quota(&self, account: &str) -> bool {
        self.quotas.iter().any(|a| a == account)
    }
}

impl Refused {
    /// The monitor's refusal after `waited`, classified by what `accounts` says of the refusing
    /// account.
    pub(crate) fn admit(error: AdmitError, waited: Duration, accounts: &Accounts) -> Refused {
        let reason = match &error {
            AdmitError::TimedOut { .. } => Reason::TimedOut,
            AdmitError::Refused { account, refusal } => match refusal.kind() {
                // A demand past what the account can ever grant is the request's fault, whatever
                // the account is: never a quota (429) a client would retry.
                RefusalKind::TooLarge { .. } if accounts.is_bytes(account) => Reason::TooLargeBytes,
                RefusalKind::TooLarge { .. } => Reason::TooLarge,
                RefusalKind::RefusingAll { .. } if accounts.is_quota(account) => Reason::Quota,
                RefusalKind::RefusingAll { .. } => Reason::CircuitOpen,
                _ if accounts.is_quota(account) => Reason::Quota,
                _ if accounts.is_bytes(account) => Reason::TooLargeBytes,
                _ => Reason::TooLarge,
            },
            AdmitError::Cancelled { .. } => Reason::Cancelled,
            // The service names the levels its jobs ask for: one the monitor lacks is its defect.
            AdmitError::Unmet { .. } | AdmitError::UnknownLevel { .. } => Reason::Misconfigured,
            _ => Reason::Unavailable,
        };
        Refused {
            reason,
            waited,
            cause: Cause::Admit(error),
            estimate: None,
        }
    }

    /// Adds `estimate()` as the time to retry when the cause knows none and the reason is one
    /// the layer estimates for.
    pub(crate) fn or_estimate(mut self, estimate: impl FnOnce() -> Duration) -> Refused {
        if self.reason.is_estimated() && self.known_retry_after().is_none() {
            self.estimate = Some(estimate());
        }
        self
    }

    /// The instant the cause itself gives.
    fn known_retry_after(&self) -> Option<Duration> {
        match &self.cause {
            Cause::Admit(error) => error.retry_after(),
            Cause::Demand(error) => error.retry_after(),
            Cause::Shed(_) => None,
        }
    }

    /// The demand function's refusal.
    pub(crate) fn demand(error: DemandError) -> Refused {
        Refused {
            reason: if error.is_quota() {
                Reason::Quota
            } else {
                Reason::Invalid
            },
            waited: Duration::ZERO,
            cause: Cause::Demand(error),
            estimate: None,
        }
    }

    /// Refused by the line bound, with `estimate` to retry after: at once, unless
    /// [`after_waiting`](Refused::after_waiting) says otherwise.
    pub(crate) fn shed(full: LineFull, estimate: Duration) -> Refused {
        Refused {
            reason: Reason::Shed,
            waited: Duration::ZERO,
            cause: Cause::Shed(full),
            estimate: Some(estimate),
        }
    }

    /// The same refusal, after the request waited `waited`.
    pub(crate) fn after_waiting(mut self, waited: Duration) -> Refused {
        self.waited = waited;
        self
    }

    /// Why.
    pub fn reason(&self) -> Reason {
        self.reason
    }

    /// How long the request waited before it was refused, on the monitor's clock.
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// What said no.
    pub fn cause(&self) -> &Cause {
        &self.cause
    }

    /// The monitor's error, when the monitor refused.
    pub fn admit_error(&self) -> Option<&AdmitError> {
        match &self.cause {
            Cause::Admit(error) => Some(error),
            Cause::Demand(_) | Cause::Shed(_) => None,
        }
    }

    /// The refusing account's name, when an account refused.
    pub fn account(&self) -> Option<&str> {
        match &self.cause {
            Cause::Admit(
                AdmitError::Refused { account, .. } | AdmitError::Unmet { account, .. },
            ) => Some(account),
            _ => None,
        }
    }

    /// The facts of a demand that can never fit, for [`Reason::TooLarge`] and
    /// [`Reason::TooLargeBytes`] refusals by the monitor; `None` otherwise.
    pub fn never_fits(&self) -> Option<NeverFits<'_>> {
        match (&self.reason, &self.cause) {
            (Reason::TooLarge | Reason::TooLargeBytes, Cause::Admit(error)) => {
                NeverFits::from_error(error)
            }
            _ => None,
        }
    }

    /// When to try again, and where that comes from: whoever refused, when it knows (an open
    /// circuit's cooldown, a quota's reset); otherwise, for a refusal by the monitor's line (a
    /// timeout, a cancelled job, a stopped or failing monitor), the layer's estimate (see
    /// [`RetryEstimate`](crate::RetryEstimate)). `None` for a refusal that retrying cannot
    /// help (a demand that can never fit, an invalid request, a misconfigured service) and for a
    /// quota with no known reset.
    pub fn retry_hint(&self) -> Option<RetryAfter> {
        match (self.known_retry_after(), self.estimate) {
            (Some(known), _) => Some(RetryAfter::Known(known)),
            (None, Some(estimate)) => Some(RetryAfter::Estimated(estimate)),
            (None, None) => None,
        }
    }

    /// When to try again ([`retry_hint`](Refused::retry_hint) without its source).
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_hint().map(RetryAfter::duration)
    }

    /// [`retry_after`](Refused::retry_after) in whole seconds as a `Retry-After` header says
    /// it: rounded up, and at least 1 (a `Retry-After: 0` invites a retry storm).
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.retry_after().map(Refused::whole_seconds)
    }

    /// `after` in whole seconds, rounded up, at least 1 (saturating at `u64::MAX`).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_tower::Refused;
    ///
    /// assert_eq!(Refused::whole_seconds(Duration::ZERO), 1);
    /// assert_eq!(Refused::whole_seconds(Duration::from_millis(2_000)), 2);
    /// assert_eq!(Refused::whole_seconds(Duration::from_millis(2_001)), 3);
    /// ```
    pub fn whole_seconds(after: Duration) -> u64 {
        after
            .as_secs()
            .saturating_add(u64::from(after.subsec_nanos() > 0))
            .max(1)
    }
}

/// The layer's error when refusals are not mapped to responses: the request was refused, or the
/// inner service failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdmissionError<E> {
    /// The request was not admitted; the inner service was not called.
    #[error(transparent)]
    Refused(Refused),
    /// The inner service failed (its grant was released).
    #[error("the inner service failed: {0}")]
    Inner(E),
}

impl<E> AdmissionError<E> {
    /// For a refusal, when to try again ([`Refused::retry_after`]); `None` otherwise.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            AdmissionError::Refused(refused) => refused.retry_after(),
            AdmissionError::Inner(_) => None,
        }
    }

    /// The refusal, if this is one.
    pub fn refused(&self) -> Option<&Refused> {
        match self {
            AdmissionError::Refused(refused) => Some(refused),
            AdmissionError::Inner(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use admission_core::{Amount, Refusal};

    fn accounts() -> Accounts {
        Accounts {
            bytes: vec!["upload".into()],
            quotas: vec!["tenant".into()],
        }
    }

    fn refused_by(account: &str, refusal: Refusal) -> Refused {
        let error = AdmitError::Refused {
            account: account.into(),
            refusal,
        };
        Refused::admit(error, Duration::ZERO, &accounts())
    }

    #[test]
    fn whole_seconds_round_up_and_are_never_zero() {
        assert_eq!(Refused::whole_seconds(Duration::ZERO), 1);
        assert_eq!(Refused::whole_seconds(Duration::from_nanos(1)), 1);
        assert_eq!(Refused::whole_seconds(Duration::from_secs(1)), 1);
        assert_eq!(Refused::whole_seconds(Duration::from_millis(1_500)), 2);
        assert_eq!(Refused::whole_seconds(Duration::MAX), u64::MAX);
    }

    #[test]
    fn a_refusal_is_classified_by_its_kind_and_its_account() {
        let open = Refusal::temporary("open", Duration::from_millis(2_500));
        let too_large = Refusal::too_large(Amount::units(5), Amount::units(2));
        let other = Refusal::new("never");
        assert_eq!(
            refused_by("http", open.clone()).reason(),
            Reason::CircuitOpen
        );
        assert_eq!(refused_by("tenant", open.clone()).reason(), Reason::Quota);
        assert_eq!(
            refused_by("http", too_large.clone()).reason(),
            Reason::TooLarge
        );
        assert_eq!(
            refused_by("upload", too_large.clone()).reason(),
            Reason::TooLargeBytes
        );
        // Past what a quota can ever grant: the request's fault, not a quota to wait for.
        assert_eq!(refused_by("tenant", too_large).reason(), Reason::TooLarge);
        assert_eq!(
            refused_by("upload", other.clone()).reason(),
            Reason::TooLargeBytes
        );
        assert_eq!(refused_by("tenant", other.clone()).reason(), Reason::Quota);
        assert_eq!(refused_by("http", other).reason(), Reason::TooLarge);
        let circuit = refused_by("http", open);
        assert_eq!(circuit.retry_after(), Some(Duration::from_millis(2_500)));
        assert_eq!(circuit.retry_after_secs(), Some(3));
        assert_eq!(circuit.account(), Some("http"));
    }

    #[test]
    fn monitor_failures_are_unavailable_and_a_missing_capability_is_misconfigured() {
        let of = |error| Refused::admit(error, Duration::from_secs(1), &accounts());
        assert_eq!(of(AdmitError::Shutdown).reason(), Reason::Unavailable);
        let closed = AdmitError::Closed {
            cause: "bug".into(),
        };
        assert_eq!(of(closed).reason(), Reason::Unavailable);
        let unmet = AdmitError::Unmet {
            account: "window".into(),
            requires: admission_core::Capability::HTTP_CONNECTION,
        };
        assert_eq!(of(unmet).reason(), Reason::Misconfigured);
        let unknown_level = AdmitError::UnknownLevel {
            job: 1,
            level: "nightly".into(),
            known: "interactive, batch".into(),
        };
        assert_eq!(of(unknown_level).reason(), Reason::Misconfigured);
        let timed_out = of(AdmitError::TimedOut {
            job: 1,
            waited: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
        });
        assert_eq!(timed_out.reason(), Reason::TimedOut);
        assert_eq!(timed_out.retry_after(), None);
        assert_eq!(timed_out.waited(), Duration::from_secs(1));
    }

    #[test]
    fn only_refusals_of_the_line_without_a_time_of_their_own_take_the_estimate() {
        let estimate = || Duration::from_secs(4);
        let timed_out = AdmitError::TimedOut {
            job: 1,
            waited: Duration::from_secs(5),
            timeout: Duration::from_secs(5),
        };
        let of = |error| Refused::admit(error, Duration::from_secs(5), &accounts());
        let line = of(timed_out).or_estimate(estimate);
        assert_eq!(line.retry_hint(), Some(RetryAfter::Estimated(estimate())));
        assert_eq!(line.retry_after_secs(), Some(4));
        let stopped = of(AdmitError::Shutdown).or_estimate(estimate);
        assert_eq!(stopped.retry_after(), Some(estimate()));
        let cancelled = of(AdmitError::Cancelled {
            job: 2,
            waited: Duration::ZERO,
        });
        assert!(
            cancelled
                .or_estimate(estimate)
                .retry_hint()
                .unwrap()
                .is_estimate()
        );

        let open = Refusal::temporary("open", Duration::from_millis(2_500));
        let circuit = refused_by("http", open).or_estimate(estimate);
        let known = RetryAfter::Known(Duration::from_millis(2_500));
        assert_eq!(circuit.retry_hint(), Some(known));
        let too_large = Refusal::too_large(Amount::units(5), Amount::units(2));
        for never in [
            refused_by("http", too_large.clone()),
            refused_by("upload", too_large),
        ] {
            let never = never.or_estimate(estimate);
            assert_eq!(never.retry_hint(), None);
            assert!(!never.reason().is_retryable());
        }
        let spent = refused_by("tenant", Refusal::new("spent for good")).or_estimate(estimate);
        assert_eq!((spent.reason(), spent.retry_after()), (Reason::Quota, None));
        assert!(spent.reason().is_retryable());
        let unmet = of(AdmitError::Unmet {
            account: "window".into(),
            requires: admission_core::Capability::HTTP_CONNECTION,
        });
        assert_eq!(unmet.or_estimate(estimate).retry_after(), None);
    }

    #[test]
    fn a_demand_that_never_fits_gives_its_account_and_numbers() {
        let too_large = Refusal::too_large(Amount::pair(100, 1), Amount::pair(60, 9));
        let refused = refused_by("tokens", too_large);
        let never = refused.never_fits().unwrap();
        assert_eq!(never.account(), "tokens");
        assert_eq!(never.asked(), Some(Amount::pair(100, 1)));
        assert_eq!(never.capacity(), Some(Amount::pair(60, 9)));
        assert_eq!(
            never.to_string(),
            "account `tokens` asked 100+1, capacity 60+9: asks 100+1, more than the 60+9 it can \
             ever grant at once"
        );
        let other = refused_by("http", Refusal::new("no such model"));
        let never = other.never_fits().unwrap();
        assert_eq!((never.asked(), never.capacity()), (None, None));
        assert_eq!(never.to_string(), "account `http`: no such model");
        // Not a demand that can never fit: a quota, an open circuit, an invalid request.
        assert!(
            refused_by("tenant", Refusal::new("spent"))
                .never_fits()
                .is_none()
        );
        let open = Refusal::temporary("open", Duration::from_secs(1));
        assert!(refused_by("http", open).never_fits().is_none());
        let invalid = Refused::demand(DemandError::invalid("no length"));
        assert!(invalid.never_fits().is_none());
    }

    #[test]
    fn a_demand_error_is_invalid_or_a_quota() {
        let bad = Refused::demand(DemandError::invalid("no length"));
        assert_eq!((bad.reason(), bad.retry_after()), (Reason::Invalid, None));
        let spent = DemandError::quota("spent", Some(Duration::from_secs(60)));
        let spent = Refused::demand(spent);
        assert_eq!(spent.reason(), Reason::Quota);
        assert_eq!(spent.retry_after_secs(), Some(60));
    }
}
