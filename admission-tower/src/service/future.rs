//! [`ResponseFuture`]: waits for the grant, calls the inner service, and wraps its body.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use admission_core::{Admit, Instant};
use http::{Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use tower::Service;

use crate::body::AdmittedBody;
use crate::error::{Accounts, Refused, Waited};
use crate::policy::OnRefusal;
use crate::retry::{Held, Waiting};

/// Where the admit started, to say how long a refused request waited; it is in the layer's
/// line until dropped or granted.
struct Started {
    waiting: Waiting,
    at: Instant,
    accounts: Arc<Accounts>,
}

pin_project! {
    #[project = StateProj]
    #[project_replace = StateReplace]
    enum State<S, R, F> {
        // Waiting in the monitor's line; `inner` was polled ready.
        Admitting {
            // The admit keeps its waiter's outcome slot inside itself: pinned in place.
            #[pin]
            admit: Admit,
            inner: S,
            request: R,
            started: Started,
        },
        // Granted: the inner service runs, the grant waits for its response.
        Calling {
            #[pin]
            future: F,
            grant: Held,
        },
        // Refused without waiting.
        Refused {
            refused: Refused,
        },
        Done,
    }
}

pin_project! {
    /// The future of [`Admission::call`](crate::Admission): admission, then the inner service.
    ///
    /// # Cancel safety
    ///
    /// Dropping it while it waits withdraws the waiter from the monitor's line (a grant that
    /// landed meanwhile is rolled back); dropping it while the inner service runs releases the
    /// grant.
    ///
    /// # Panics
    ///
    /// Polling it again after it completed panics, as most futures do.
    pub struct ResponseFuture<S, R, P>
    where
        S: Service<R>,
    {
        #[pin]
        state: State<S, R, S::Future>,
        policy: Arc<P>,
    }
}

impl<S: Service<R>, R, P> ResponseFuture<S, R, P> {
    pub(crate) fn admitting(
        admit: Admit,
        inner: S,
        request: R,
        policy: Arc<P>,
        waiting: Waiting,
        accounts: Arc<Accounts>,
    ) -> ResponseFuture<S, R, P> {
        let at = waiting.drain().clock().now();
        ResponseFuture {
            state: State::Admitting {
                admit,
                inner,
                request,
                started: Started {
                    waiting,
                    at,
                    accounts,
                },
            },
            policy,
        }
    }

    /// Granted at once: the inner service's `future` runs, `grant` waits for its response.
    pub(crate) fn calling(
        future: S::Future,
        grant: Held,
        policy: Arc<P>,
    ) -> ResponseFuture<S, R, P> {
        ResponseFuture {
            state: State::Calling { future, grant },
            policy,
        }
    }

    pub(crate) fn refused(refused: Refused, policy: Arc<P>) -> ResponseFuture<S, R, P> {
        ResponseFuture {
            state: State::Refused { refused },
            policy,
        }
    }
}

impl<S, ReqB, ResB, P> Future for ResponseFuture<S, Request<ReqB>, P>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: Body,
    P: OnRefusal<ResB, S::Error>,
{
    type Output = Result<Response<AdmittedBody<ResB>>, P::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Admitting { admit, started, .. } => {
                    let outcome = match admit.poll(cx) {
                        Poll::Ready(outcome) => Ok(outcome),
                        Poll::Pending => {
                            // Shed from the line: it could no longer be served within the
                            // bound. Dropping the admit below withdraws it from the monitor.
                            match started.waiting.poll_shed(cx) {
                                Some(full) => Err(full),
                                None => return Poll::Pending,
                            }
                        }
                    };
                    let StateReplace::Admitting {
                        mut inner,
                        mut request,
                        started,
                        ..
                    } = this.state.as_mut().project_replace(State::Done)
                    else {
                        unreachable!("the state was Admitting")
                    };
                    let drain = started.waiting.drain().clone();
                    let waited = || {
                        let now = drain.clock().now();
                        now.saturating_duration_since(started.at)
                    };
                    match outcome {
                        Ok(Ok(grant)) => {
                            let wall_wait = grant.wall_wait();
                            request.extensions_mut().insert(Waited(wall_wait));
                            // The monitor's word on whether it waited (zero for a grant at
                            // once), not whether this future happened to be polled before it.
                            let grant = started.waiting.granted(grant, !wall_wait.is_zero());
                            let future = inner.call(request);
                            this.state.set(State::Calling { future, grant });
                        }
                        Ok(Err(error)) => {
                            // Still in the line while the estimate is made: a retry waits
                            // behind everyone that waited with it, and its own turn.
                            let waited = waited();
                            let refused = Refused::admit(error, waited, &started.accounts)
                                .or_estimate(|| drain.estimate(waited));
                            return Poll::Ready(this.policy.refused(refused));
                        }
                        Err(full) => {
                            let waited = waited();
                            let retry_after = drain.retry_after_shed(&full);
                            let refused = Refused::shed(full, retry_after).after_waiting(waited);
                            return Poll::Ready(this.policy.refused(refused));
                        }
                    }
                }
                StateProj::Calling { future, .. } => {
                    let outcome = ready!(future.poll(cx));
                    let StateReplace::Calling { grant, .. } =
                        this.state.as_mut().project_replace(State::Done)
                    else {
                        unreachable!("the state was Calling")
                    };
                    return Poll::Ready(match outcome {
                        Ok(response) => Ok(response.map(|body| AdmittedBody::held(body, grant))),
                        // The grant is dropped here: released.
                        Err(error) => Err(this.policy.failed(error)),
                    });
                }
                StateProj::Refused { .. } => {
                    let StateReplace::Refused { refused } =
                        this.state.as_mut().project_replace(State::Done)
                    else {
                        unreachable!("the state was Refused")
                    };
                    return Poll::Ready(this.policy.refused(refused));
                }
                StateProj::Done => panic!("`ResponseFuture` polled after completion"),
            }
        }
    }
}

impl<S: Service<R>, R, P> fmt::Debug for ResponseFuture<S, R, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Admitting { .. } => "admitting",
            State::Calling { .. } => "calling",
            State::Refused { .. } => "refused",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}
