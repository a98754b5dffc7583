//! The two ways to wait: the [`Admit`] future and the blocking call, one line for both.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use super::grant::Grant;
use crate::clock::Instant;
use crate::context::JobContext;
use crate::demand::Demand;
use crate::error::AdmitError;

use super::arrival::Begin;
use super::cell::{Cell, Outcome};
use super::line::Place;
use super::shared::Shared;

/// A parked waiter's ticket.
struct Ticket {
    place: Place,
    cell: Arc<Cell>,
    ctx: JobContext,
    /// The cancellation listener registered on `ctx`; forgotten when the wait ends.
    listener: Option<u64>,
}

impl Ticket {
    fn park(shared: &Arc<Shared>, place: Place, cell: Arc<Cell>, ctx: &JobContext) -> Ticket {
        let weak = Arc::downgrade(shared);
        let listener = ctx.on_cancel(Box::new(move || {
            if let Some(shared) = weak.upgrade() {
                shared.cancel_waiter(place);
            }
        }));
        if listener.is_none() {
            // Cancelled between asking and parking.
            shared.cancel_waiter(place);
        }
        Ticket {
            place,
            cell,
            ctx: ctx.clone(),
            listener,
        }
    }

    fn done(&mut self) {
        if let Some(key) = self.listener.take() {
            self.ctx.forget(key);
        }
    }
}

pub(crate) fn admit_blocking(
    shared: &Arc<Shared>,
    demand: Demand,
    ctx: &JobContext,
    timeout: Option<Duration>,
) -> Outcome {
    match shared.begin(demand, ctx, timeout) {
        Begin::Done(outcome) => outcome,
        Begin::Parked {
            place,
            cell,
            deadline,
        } => {
            let mut ticket = Ticket::park(shared, place, cell, ctx);
            let outcome = wait_until(shared, &ticket, deadline);
            ticket.done();
            outcome
        }
    }
}

/// Waits for a blocking waiter's outcome. Its deadline is kept by its own timer as well as by the
/// evaluator: when the clock says the deadline has passed, the waiter times itself out.
fn wait_until(shared: &Arc<Shared>, ticket: &Ticket, deadline: Option<Instant>) -> Outcome {
    let Some(deadline) = deadline else {
        return ticket.cell.wait();
    };
    loop {
        // `None`: real time does not move this clock (a fake one); its passes keep the deadline.
        let Some(wait) = shared.clock.real_wait(deadline) else {
            return ticket.cell.wait();
        };
        if wait.is_zero() {
            // Due: leave the line unless an outcome got there first; either way one is coming.
            shared.expire(ticket.place);
            return ticket.cell.wait();
        }
        if let Some(outcome) = ticket.cell.wait_for(wait) {
            return outcome;
        }
    }
}

enum State {
    Init {
        demand: Demand,
        ctx: JobContext,
        timeout: Option<Duration>,
    },
    Waiting(Ticket),
    Done,
}

/// The future returned by [`Monitor::admit`](crate::Monitor::admit).
///
/// It does nothing until first polled; then it is granted at once, refused at once, or parks in
/// the line and completes when the evaluator grants or refuses it.
///
/// # Cancel safety
///
/// Dropping the future withdraws the waiter from the line. If a grant landed concurrently, it is
/// rolled back (everything returned, metered debits included): an abandoned admit never keeps a
/// permit.
#[must_use = "futures do nothing unless polled"]
pub struct Admit {
    shared: Arc<Shared>,
    state: State,
}

impl Admit {
    pub(crate) fn new(
        shared: Arc<Shared>,
        demand: Demand,
        ctx: JobContext,
        timeout: Option<Duration>,
    ) -> Admit {
        Admit {
            shared,
            state: State::Init {
                demand,
                ctx,
                timeout,
            },
        }
    }
}

impl Future for Admit {
    type Output = Result<Grant, AdmitError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let State::Init { .. } = this.state {
            let State::Init {
                demand,
                ctx,
                timeout,
            } = std::mem::replace(&mut this.state, State::Done)
            else {
                unreachable!("checked above")
            };
            match this.shared.begin(demand, &ctx, timeout) {
                Begin::Done(outcome) => return Poll::Ready(outcome),
                Begin::Parked { place, cell, .. } => {
                    this.state = State::Waiting(Ticket::park(&this.shared, place, cell, &ctx));
                }
            }
        }
        match &mut this.state {
            State::Waiting(ticket) => match ticket.cell.poll(cx.waker()) {
                Some(outcome) => {
                    ticket.done();
                    this.state = State::Done;
                    Poll::Ready(outcome)
                }
                None => Poll::Pending,
            },
            State::Done => panic!("`Admit` polled after completion"),
            State::Init { .. } => unreachable!("replaced above"),
        }
    }
}

impl Drop for Admit {
    fn drop(&mut self) {
        if let State::Waiting(ticket) = &mut self.state {
            ticket.done();
            if !self.shared.withdraw(ticket.place) {
                // The outcome landed while we were leaving: give a grant back in full.
                if let Some(Ok(mut grant)) = ticket.cell.take() {
                    grant.rollback();
                }
            }
        }
    }
}

impl fmt::Debug for Admit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Init { .. } => "init",
            State::Waiting(_) => "waiting",
            State::Done => "done",
        };
        f.debug_struct("Admit").field("state", &state).finish()
    }
}
