//! [`AdmissionLayer`]: the configuration every [`Admission`] service it builds shares.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use admission_core::Monitor;
use tower::Layer;

use crate::error::{Accounts, Refused};
#[cfg(any(feature = "http", feature = "grpc"))]
use crate::policy::RespondFn;
use crate::policy::{Propagate, Respond};
use crate::retry::{Drain, LineBound, RetryEstimate};
use crate::service::Admission;

/// What a layer and each of its services share: cheap to clone.
pub(crate) struct Config<D, P> {
    pub(crate) monitor: Monitor,
    pub(crate) demand: Arc<D>,
    pub(crate) policy: Arc<P>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) accounts: Arc<Accounts>,
    /// The layer's completions and waiters, for retry estimates.
    pub(crate) drain: Arc<Drain>,
    /// Past it, a request is refused at once.
    pub(crate) shed: Option<LineBound>,
}

impl<D, P> Clone for Config<D, P> {
    fn clone(&self) -> Self {
        Config {
            monitor: self.monitor.clone(),
            demand: self.demand.clone(),
            policy: self.policy.clone(),
            timeout: self.timeout,
            accounts: self.accounts.clone(),
            drain: self.drain.clone(),
            shed: self.shed,
        }
    }
}

/// A tower [`Layer`] that admits each request's whole demand before the inner service runs.
///
/// `demand` is a function `Fn(&http::Request<B>) -> Result<(Demand, JobContext), DemandError>`:
/// it reads the request (a header, the content length, the route) and says everything the
/// request will hold while it runs. Each request then waits in the monitor's one fair line,
/// holding nothing, for all of it. The grant lives in the response body ([`AdmittedBody`]) and
/// goes back when the body ends.
///
/// Refusals are errors ([`AdmissionError`]) by default; [`on_refusal`](AdmissionLayer::on_refusal)
/// (or, with the features, [`http_responses`](AdmissionLayer::http_responses) and
/// [`grpc_responses`](AdmissionLayer::grpc_responses)) turns them into responses. A refusal by
/// the monitor's line that knows no retry time of its own gets the layer's estimate
/// ([`retry_estimate`](AdmissionLayer::retry_estimate)).
///
/// [`AdmittedBody`]: crate::AdmittedBody
/// [`AdmissionError`]: crate::AdmissionError
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use admission_accounts::CountingGate;
/// use admission_core::{Amount, Demand, JobContext, Monitor};
/// use admission_tower::{AdmissionLayer, DemandError};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let monitor = Monitor::new();
/// let workers = Arc::new(CountingGate::new("workers", 8, monitor.clock().clone())?);
/// let layer = AdmissionLayer::new(monitor, move |request: &http::Request<String>| {
///     let ctx = JobContext::new(request.uri().path().to_owned());
///     Ok::<_, DemandError>((Demand::new().with(workers.clone(), Amount::ONE), ctx))
/// })
/// .timeout(Duration::from_secs(5));
/// # drop(layer);
/// # Ok(())
/// # }
/// ```
pub struct AdmissionLayer<D, P = Propagate> {
    config: Config<D, P>,
}

impl<D> AdmissionLayer<D, Propagate> {
    /// A layer admitting on `monitor` the demand `demand` builds from each request, with no
    /// timeout, refusals reported as errors.
    pub fn new(monitor: Monitor, demand: D) -> AdmissionLayer<D, Propagate> {
        let drain = Arc::new(Drain::new(
            monitor.clock().clone(),
            RetryEstimate::default(),
            None,
        ));
        AdmissionLayer {
            config: Config {
                drain,
                monitor,
                demand: Arc::new(demand),
                policy: Arc::new(Propagate),
                timeout: None,
                accounts: Arc::new(Accounts::default()),
                shed: None,
            },
        }
    }
}

impl<D, P> AdmissionLayer<D, P> {
    /// The longest a request waits for its grant, on the monitor's clock (so a test's fake clock
    /// drives it); then it is refused with [`Reason::TimedOut`](crate::Reason::TimedOut).
    pub fn timeout(mut self, timeout: Duration) -> AdmissionLayer<D, P> {
        self.config.timeout = Some(timeout);
        self
    }

    /// A new drain with the layer's settings, measuring from now.
    fn measure_anew(&mut self, estimate: RetryEstimate) {
        let clock = self.config.monitor.clock().clone();
        let drain = Drain::new(clock, estimate, self.config.shed);
        self.config.drain = Arc::new(drain);
    }

    /// Names an account that counts bytes: a demand that can never fit it is refused with
    /// [`Reason::TooLargeBytes`](crate::Reason::TooLargeBytes) (HTTP 413, Content Too Large:
    /// the request's own size is what can never fit; any other account's is a 422, see
    /// [`crate::http`]).
    pub fn bytes_account(mut self, account: impl Into<String>) -> AdmissionLayer<D, P> {
        Arc::make_mut(&mut self.config.accounts)
            .bytes
            .push(account.into());
        self
    }

    /// Names an account that is a quota: its refusals are [`Reason::Quota`](crate::Reason::Quota)
    /// (HTTP 429) rather than an open circuit, except a demand more than the quota can ever
    /// grant at once ([`RefusalKind::TooLarge`](admission_core::RefusalKind::TooLarge)), which
    /// is [`Reason::TooLarge`](crate::Reason::TooLarge) (HTTP 422) like any other: waiting for
    /// the window to reset cannot help it.
    pub fn quota_account(mut self, account: impl Into<String>) -> AdmissionLayer<D, P> {
        Arc::make_mut(&mut self.config.accounts)
            .quotas
            .push(account.into());
        self
    }

    /// How the retry time of a refusal without one of its own is estimated (a timeout in the
    /// line, a cancelled job, a stopped or failing monitor): see [`RetryEstimate`] for the
    /// computation. The default has a floor of 1 s, a ceiling of 60 s and a window of 10 s.
    ///
    /// The layer measures from when this is called: set it while building the layer.
    pub fn retry_estimate(mut self, estimate: RetryEstimate) -> AdmissionLayer<D, P> {
        self.measure_anew(estimate);
        self
    }

    /// Refuses a request at once, before it waits, when the line is past `bound`
    /// ([`Reason::Shed`](crate::Reason::Shed): HTTP 503 and gRPC `UNAVAILABLE` with the layer's
    /// retry estimate); see [`LineBound`]. By default there is no bound: every request waits up
    /// to the timeout.
    ///
    /// A request is checked after its demand is built (a request no demand can be built from is
    /// still a 400) and before it joins the line. Past the bound, the monitor is asked once for
    /// the whole demand without waiting
    /// ([`Monitor::try_admit`](admission_core::Monitor::try_admit)): granted there and then, the
    /// request is served; a demand that can never fit is refused as such (413 or 422, gRPC
    /// `INVALID_ARGUMENT`: never a 503 a client would retry); only a request that would wait is
    /// shed.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use admission_accounts::CountingGate;
    /// use admission_core::{Amount, Demand, JobContext, Monitor};
    /// use admission_tower::{AdmissionLayer, DemandError, LineBound};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let monitor = Monitor::new();
    /// let workers = Arc::new(CountingGate::new("workers", 8, monitor.clock().clone())?);
    /// let timeout = Duration::from_secs(5);
    /// let layer = AdmissionLayer::new(monitor, move |_: &http::Request<String>| {
    ///     Ok::<_, DemandError>((Demand::new().with(workers.clone(), Amount::ONE), JobContext::new("job")))
    /// })
    /// .timeout(timeout)
    /// // What would wait past the timeout is refused now, not after it (with half a second to
    /// // spare, so that a grant due at the end does not race the timeout).
    /// .shed(LineBound::ExpectedWait(timeout - Duration::from_millis(500)));
    /// # drop(layer);
    /// # Ok(())
    /// # }
    /// ```
    pub fn shed(mut self, bound: LineBound) -> AdmissionLayer<D, P> {
        self.config.shed = Some(bound);
        self.measure_anew(self.config.drain.settings());
        self
    }

    /// Answers refusals with `handler`'s responses ([`Respond`]).
    pub fn on_refusal<H>(self, handler: H) -> AdmissionLayer<D, Respond<H>>
    where
        H: Fn(&Refused) -> http::Response<String>,
    {
        self.with_policy(Respond::new(handler))
    }

    /// Any [`OnRefusal`](crate::OnRefusal) policy.
    pub fn with_policy<Q>(self, policy: Q) -> AdmissionLayer<D, Q> {
        let Config {
            monitor,
            demand,
            timeout,
            accounts,
            drain,
            shed,
            ..
        } = self.config;
        AdmissionLayer {
            config: Config {
                monitor,
                demand,
                policy: Arc::new(policy),
                timeout,
                accounts,
                drain,
                shed,
            },
        }
    }

    /// Answers refusals with HTTP statuses ([`crate::http::response`]): 503 with `Retry-After`
    /// for a timeout, an open circuit or a failing monitor, 429 for a quota (with `Retry-After`
    /// when its reset is known), 413 or 422 for a demand that can never fit (no `Retry-After`).
    #[cfg(feature = "http")]
    pub fn http_responses(self) -> AdmissionLayer<D, RespondFn> {
        self.on_refusal(crate::http::response as fn(&Refused) -> http::Response<String>)
    }

    /// Answers refusals with gRPC statuses ([`crate::grpc::response`]): `RESOURCE_EXHAUSTED`
    /// for a quota, `UNAVAILABLE` with a retry pushback for a timeout or a failing monitor,
    /// `INVALID_ARGUMENT` for a demand that can never fit.
    #[cfg(feature = "grpc")]
    pub fn grpc_responses(self) -> AdmissionLayer<D, RespondFn> {
        self.on_refusal(crate::grpc::response as fn(&Refused) -> http::Response<String>)
    }

    /// The monitor requests are admitted on.
    pub fn monitor(&self) -> &Monitor {
        &self.config.monitor
    }
}

impl<D, P> Clone for AdmissionLayer<D, P> {
    fn clone(&self) -> Self {
        AdmissionLayer {
            config: self.config.clone(),
        }
    }
}

impl<S, D, P> Layer<S> for AdmissionLayer<D, P> {
    type Service = Admission<S, D, P>;

    fn layer(&self, inner: S) -> Self::Service {
        Admission::new(inner, self.config.clone())
    }
}

impl<D, P: fmt::Debug> fmt::Debug for AdmissionLayer<D, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmissionLayer")
            .field("monitor", &self.config.monitor)
            .field("timeout", &self.config.timeout)
            .field("policy", &self.config.policy)
            .field("accounts", &self.config.accounts)
            .field("retry_estimate", &self.config.drain.settings())
            .field("shed", &self.config.shed)
            .finish_non_exhaustive()
    }
}
