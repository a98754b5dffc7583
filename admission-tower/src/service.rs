//! [`Admission`]: the service that admits a request's demand, then calls the inner service.

mod future;

use std::fmt;
use std::task::{Context, Poll};
use std::time::Duration;

use admission_core::{Demand, JobContext, TryAdmitError};
use http::{Request, Response};
use http_body::Body;
use tower::Service;

pub use future::ResponseFuture;

use crate::body::AdmittedBody;
use crate::error::{DemandError, Refused, Waited};
use crate::layer::Config;
use crate::policy::OnRefusal;

/// Admits each request's whole demand on the monitor, then calls the inner service; built by
/// [`AdmissionLayer`](crate::AdmissionLayer).
///
/// `poll_ready` is the inner service's. `call` takes the ready inner service and leaves a clone
/// in its place (tower's usual `std::mem::replace` dance, so the service that was polled ready
/// is the one called), builds the demand (a [`DemandError`] refuses at once), and returns a
/// [`ResponseFuture`] that waits for the grant and then calls it. When the line is past the
/// layer's [`LineBound`](crate::LineBound), it asks the monitor once for the whole demand
/// without waiting ([`Monitor::try_admit`](admission_core::Monitor::try_admit)) instead: granted,
/// the request is served; a demand that can never fit is refused as such (HTTP 413 or 422, gRPC
/// `INVALID_ARGUMENT`, never a retryable 503); otherwise it is shed. The admitted request
/// carries [`Waited`](crate::Waited); the response's body holds the grant until it ends.
///
/// # Fairness
///
/// Requests wait in the monitor's one FIFO line with everything else admitted there (see
/// [`Monitor`](admission_core::Monitor)): a request for much is never overtaken by a stream of
/// requests for little.
///
/// # Cancel safety
///
/// Dropping the [`ResponseFuture`] (a client that hangs up while waiting) withdraws the waiter
/// from the line; a grant that landed meanwhile is rolled back. Dropping it while the inner
/// service runs, or dropping the response body, releases the grant.
pub struct Admission<S, D, P> {
    inner: S,
    config: Config<D, P>,
}

impl<S, D, P> Admission<S, D, P> {
    pub(crate) fn new(inner: S, config: Config<D, P>) -> Admission<S, D, P> {
        Admission { inner, config }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, D, P, ReqB, ResB> Service<Request<ReqB>> for Admission<S, D, P>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    D: Fn(&Request<ReqB>) -> Result<(Demand, JobContext), DemandError>,
    P: OnRefusal<ResB, S::Error>,
    ResB: Body,
{
    type Response = Response<AdmittedBody<ResB>>;
    type Error = P::Error;
    type Future = ResponseFuture<S, Request<ReqB>, P>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|error| self.config.policy.failed(error))
    }

    fn call(&mut self, mut request: Request<ReqB>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let policy = self.config.policy.clone();
        let (demand, ctx) = match (self.config.demand)(&request) {
            Ok(built) => built,
            Err(error) => return ResponseFuture::refused(Refused::demand(error), policy),
        };
        let drain = &self.config.drain;
        let full = match drain.arrive() {
            Ok(waiting) => {
                let monitor = &self.config.monitor;
                let admit = monitor.admit(demand, &ctx, self.config.timeout);
                let accounts = self.config.accounts.clone();
                return ResponseFuture::admitting(admit, inner, request, policy, waiting, accounts);
            }
            Err(full) => full,
        };
        // Past the bound. One question to the monitor, taking nothing unless it grants the
        // whole demand now: a demand that can never fit is refused as such (413 or 422, not a
        // retryable 503), one that fits now is served, and only one that would wait is shed.
        let refused = match self.config.monitor.try_admit(&demand, &ctx) {
            Ok(grant) => {
                drain.served_at_once();
                request.extensions_mut().insert(Waited(Duration::ZERO));
                let grant = drain.hold(grant.into_owned());
                return ResponseFuture::calling(inner.call(request), grant, policy);
            }
            Err(TryAdmitError::Admit(error)) => {
                Refused::admit(error, Duration::ZERO, &self.config.accounts)
                    .or_estimate(|| drain.estimate(Duration::ZERO))
            }
            // It would wait.
            Err(_) => {
                let retry_after = drain.retry_after_shed(&full);
                Refused::shed(full, retry_after)
            }
        };
        ResponseFuture::refused(refused, policy)
    }
}

impl<S: Clone, D, P> Clone for Admission<S, D, P> {
    fn clone(&self) -> Self {
        Admission {
            inner: self.inner.clone(),
            config: self.config.clone(),
        }
    }
}

impl<S: fmt::Debug, D, P> fmt::Debug for Admission<S, D, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admission")
            .field("inner", &self.inner)
            .field("monitor", &self.config.monitor)
            .field("timeout", &self.config.timeout)
            .finish_non_exhaustive()
    }
}
