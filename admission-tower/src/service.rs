//! [`Admission`]: the service that admits a request's demand, then calls the inner service.

mod future;

use std::fmt;
use std::task::{Context, Poll};

use admission_core::{Demand, JobContext};
use http::{Request, Response};
use http_body::Body;
use tower::Service;

pub use future::ResponseFuture;

use crate::body::AdmittedBody;
use crate::error::{DemandError, Refused};
use crate::layer::Config;
use crate::policy::OnRefusal;

/// Admits each request's whole demand on the monitor, then calls the inner service; built by
/// [`AdmissionLayer`](crate::AdmissionLayer).
///
/// `poll_ready` is the inner service's. `call` builds the demand (a [`DemandError`] refuses at
/// once), refuses at once when the line is past the layer's
/// [`LineBound`](crate::LineBound), takes the ready inner service and leaves a clone in its place (tower's usual
/// `std::mem::replace` dance, so the service that was polled ready is the one called), and
/// returns a [`ResponseFuture`] that waits for the grant and then calls it. The admitted request
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

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let policy = self.config.policy.clone();
        match (self.config.demand)(&request) {
            Err(error) => ResponseFuture::refused(Refused::demand(error), policy),
            Ok((demand, ctx)) => {
                let drain = &self.config.drain;
                if let Some(full) = self.config.shed.and_then(|bound| drain.past(bound)) {
                    // Retry once the requests already waiting have been served.
                    let estimate = drain.estimate(std::time::Duration::ZERO);
                    return ResponseFuture::refused(Refused::shed(full, estimate), policy);
                }
                let monitor = &self.config.monitor;
                let admit = monitor.admit(demand, &ctx, self.config.timeout);
                ResponseFuture::admitting(
                    admit,
                    inner,
                    request,
                    policy,
                    &self.config.drain,
                    self.config.accounts.clone(),
                )
            }
        }
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
