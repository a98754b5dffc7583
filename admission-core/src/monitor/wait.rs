//! The two ways to wait: the [`Admit`] future and the blocking call, one line for both.

use std::fmt;
use std::future::Future;
use std::marker::PhantomPinned;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use super::grant::Grant;
use super::span::AdmissionSpan;
use crate::clock::Instant;
use crate::context::{JobContext, LeaveOnCancel, Listener};
use crate::demand::Demand;
use crate::error::AdmitError;

use super::arrival::{Begin, Stand, Unsettled};
use super::cell::{Cell, CellRef, Outcome};
use super::line::{Place, Record, RecordRef};
use super::shared::Shared;

/// What a waiter keeps while it may be in the line: its place, and the cancellation listener it
/// registered on its job's context once parked. (A job granted at once keeps nothing.)
#[derive(Default)]
struct Ticket {
    /// Where the waiter stands; `Some` from the moment it parked until it has seen its record
    /// leave the line (it took its outcome, or withdrew). While it is `Some`, the waiter's cell
    /// and record must stay where they are (`cell.rs`, `line.rs`).
    place: Option<Place>,
    /// The context the cancellation listener is registered on, and its key; forgotten when the
    /// wait ends.
    listener: Option<(JobContext, u64)>,
}

impl Ticket {
    /// Called once the waiter is parked: cancelling its job takes it out of the line.
    fn listen(&mut self, shared: &Arc<Shared>, ctx: &JobContext) {
        let Some(place) = self.place else { return };
        let line: Weak<dyn LeaveOnCancel> = Arc::downgrade(shared) as Weak<Shared>;
        match ctx.on_cancel(Listener::Leave(line, place.waiter_key())) {
            Some(key) => self.listener = Some((ctx.clone(), key)),
            // Cancelled between asking and parking.
            None => shared.cancel_waiter(place),
        }
    }

    /// Forgets the cancellation listener, if one was registered.
    fn forget_listener(&mut self) {
        if let Some((ctx, key)) = self.listener.take() {
            ctx.forget(key);
        }
    }

    /// The outcome was taken: the record is out of the line and the wait is over.
    fn settle(&mut self) {
        self.forget_listener();
        self.place = None;
    }

    /// The waiter goes away without its outcome (a dropped future, an unwinding call): it leaves
    /// the line, and a grant that landed meanwhile is given back in full. Afterwards its record
    /// is out of the line, so `cell` may go.
    fn leave(&mut self, shared: &Shared, cell: &Cell) {
        self.forget_listener();
        if let Some(place) = self.place.take()
            && !shared.withdraw(place)
        {
            // The outcome landed while we were leaving: give a grant back in full.
            if let Some(Ok(mut grant)) = cell.take() {
                grant.rollback();
            }
        }
    }
}

/// The blocking call's waiter: its cell (and record) on this frame, and a ticket that leaves the
/// line if the call unwinds before its outcome is taken.
struct Blocked<'a> {
    shared: &'a Arc<Shared>,
    cell: &'a Cell,
    ticket: Ticket,
}

impl Drop for Blocked<'_> {
    fn drop(&mut self) {
        self.ticket.leave(self.shared, self.cell);
    }
}

pub(crate) fn admit_blocking(
    shared: &Arc<Shared>,
    demand: Demand,
    ctx: &JobContext,
    timeout: Option<Duration>,
) -> Outcome {
    let span = AdmissionSpan::begin(ctx, &demand);
    let _entered = span.span().enter();
    // The fast path first: a job granted at once sets nothing up for a wait.
    let outcome = match shared.arrive_unlocked(demand, ctx) {
        Ok(outcome) => outcome,
        Err(unsettled) => arrive_and_wait(shared, unsettled, ctx, timeout),
    };
    span.end(&outcome);
    outcome
}

/// The rest of a blocking admit the fast path did not settle: a cell and a record on this frame,
/// the locked arrival, and the wait if it parks. Out of line, so the fast path's frame stays
/// small.
#[inline(never)]
fn arrive_and_wait(
    shared: &Arc<Shared>,
    unsettled: Unsettled<'_>,
    ctx: &JobContext,
    timeout: Option<Duration>,
) -> Outcome {
    let cell = Cell::new();
    let record = Record::default();
    // Declared after `cell` and `record`, so dropped before them: leaving the line (if still in
    // it) comes first.
    let mut blocked = Blocked {
        shared,
        cell: &cell,
        ticket: Ticket::default(),
    };
    // SAFETY: `cell` and `record` stay on this frame, untouched, until `blocked` is dropped, and
    // `blocked` keeps the place the arrival writes: its drop (on return or unwind) withdraws the
    // waiter unless the outcome was taken, which is the rule `CellRef::new` and
    // `RecordRef::new` ask for.
    let stand = unsafe {
        Stand {
            cell: CellRef::new(&cell),
            record: RecordRef::new(&record),
        }
    };
    match shared.begin(unsettled, ctx, timeout, stand, &mut blocked.ticket.place) {
        Begin::Done(outcome) => outcome,
        Begin::Parked { deadline, .. } => {
            blocked.ticket.listen(shared, ctx);
            let outcome = wait_until(&blocked, deadline);
            blocked.ticket.settle();
            outcome
        }
    }
}

/// Waits for a blocking waiter's outcome. Its deadline is kept by its own timer as well as by the
/// evaluator: when the clock says the deadline has passed, the waiter times itself out.
fn wait_until(blocked: &Blocked<'_>, deadline: Option<Instant>) -> Outcome {
    let (shared, cell) = (blocked.shared, blocked.cell);
    let Some(deadline) = deadline else {
        return cell.wait();
    };
    loop {
        // `None`: real time does not move this clock (a fake one); its passes keep the deadline.
        let Some(wait) = shared.clock.real_wait(deadline) else {
            return cell.wait();
        };
        if wait.is_zero() {
            // Due: leave the line unless an outcome got there first; either way one is coming.
            if let Some(place) = blocked.ticket.place {
                shared.expire(place);
            }
            return cell.wait();
        }
        if let Some(outcome) = cell.wait_for(wait) {
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
/// A parked waiter's outcome slot lives inside this future, so parking allocates nothing for it;
/// that is why the future is `!Unpin`: pin it (`std::pin::pin!`, `Box::pin`) to poll it by hand.
/// `.await` pins it for you.
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
    /// The outcome's slot and the waiter's record, which the line points at while the waiter is
    /// parked: pinned with the future (`cell.rs`, `line.rs`).
    cell: Cell,
    record: Record,
    /// The admission's `tracing` span (`span.rs`), from the first poll on.
    span: Option<AdmissionSpan>,
    _pinned: PhantomPinned,
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
            cell: Cell::new(),
            record: Record::default(),
            span: None,
            _pinned: PhantomPinned,
        }
    }
}

impl Future for Admit {
    type Output = Result<Grant, AdmitError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: `cell` and `record` are never moved out of the future (only `state`'s contents
        // are, and they are not pinned), so the addresses the line holds stay valid until
        // `drop`.
        let this = unsafe { self.get_unchecked_mut() };
        if let State::Init { .. } = this.state {
            let State::Init {
                demand,
                ctx,
                timeout,
            } = std::mem::replace(&mut this.state, State::Done)
            else {
                unreachable!("checked above")
            };
            let span = this.span.insert(AdmissionSpan::begin(&ctx, &demand));
            let _entered = span.span().enter();
            let unsettled = match this.shared.arrive_unlocked(demand, &ctx) {
                Ok(outcome) => {
                    span.end(&outcome);
                    return Poll::Ready(outcome);
                }
                Err(unsettled) => unsettled,
            };
            this.state = State::Waiting(Ticket::default());
            let State::Waiting(ticket) = &mut this.state else {
                unreachable!("set above")
            };
            // SAFETY: the future is pinned, so `cell` and `record` stay where they are until the
            // future is dropped, and nothing here touches them meanwhile; its `drop` withdraws
            // the waiter (through the ticket holding the place the arrival writes) unless the
            // outcome was taken: the rule `CellRef::new` and `RecordRef::new` ask for.
            let stand = unsafe {
                Stand {
                    cell: CellRef::new(&this.cell),
                    record: RecordRef::new(&this.record),
                }
            };
            match this
                .shared
                .begin(unsettled, &ctx, timeout, stand, &mut ticket.place)
            {
                Begin::Done(outcome) => {
                    this.state = State::Done;
                    span.end(&outcome);
                    return Poll::Ready(outcome);
                }
                Begin::Parked { .. } => ticket.listen(&this.shared, &ctx),
            }
        }
        match &mut this.state {
            State::Waiting(ticket) => match this.cell.poll(cx.waker()) {
                Some(outcome) => {
                    ticket.settle();
                    this.state = State::Done;
                    // Out of the line (the outcome's fill took it out): what is left of the
                    // waiter (its demand if refused, its job) goes now, not with the future.
                    this.record.clear();
                    if let Some(span) = &this.span {
                        span.end(&outcome);
                    }
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
            ticket.leave(&self.shared, &self.cell);
            if let Some(span) = &self.span {
                span.abandon();
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
