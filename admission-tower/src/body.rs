//! [`AdmittedBody`]: a response body that holds the request's grant until the body ends.
//!
//! tower's own `ConcurrencyLimit` gives its permit back when the response head is ready, so a
//! streamed body runs on after its slot was handed to someone else. Here the grant rides inside
//! the body: it is released when the body yields its last frame (or reports its end), when it
//! fails, or when it is dropped (a client that hangs up mid-stream), whichever comes first.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::retry::Held;

pin_project! {
    /// The inner service's body with the request's grant held inside it, or the body of a
    /// refusal response (one chunk, no grant).
    ///
    /// # Cancel safety
    ///
    /// Dropping the body at any point releases the grant: a client that disconnects mid-stream
    /// gives its permits back as the server drops the response.
    pub struct AdmittedBody<B>
    where
        B: Body,
    {
        #[pin]
        kind: Kind<B, B::Data>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B, D> {
        Held {
            #[pin]
            body: B,
            // `Some` until the body ends, fails or is dropped.
            grant: Option<Held>,
        },
        Full {
            // The refusal's one chunk, taken by the first poll.
            data: Option<D>,
        },
    }
}

impl<B: Body> AdmittedBody<B> {
    /// `body`, holding `grant` until it ends.
    pub(crate) fn held(body: B, grant: Held) -> AdmittedBody<B> {
        let grant = (!body.is_end_stream()).then_some(grant);
        AdmittedBody {
            kind: Kind::Held { body, grant },
        }
    }

    /// A body of one chunk (none when `data` is `None`), holding nothing.
    pub(crate) fn full(data: Option<B::Data>) -> AdmittedBody<B> {
        AdmittedBody {
            kind: Kind::Full { data },
        }
    }

    /// True while the body still holds its grant.
    pub fn holds_grant(&self) -> bool {
        matches!(&self.kind, Kind::Held { grant: Some(_), .. })
    }
}

impl<B: Body> Body for AdmittedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Held { mut body, grant } => {
                let frame = match body.as_mut().poll_frame(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(frame) => frame,
                };
                // The body ends with this frame (or has ended, or failed): the permits go back
                // now, before the server writes the frame out.
                let ended = match &frame {
                    None | Some(Err(_)) => true,
                    Some(Ok(_)) => body.is_end_stream(),
                };
                if ended {
                    grant.take();
                }
                Poll::Ready(frame)
            }
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Held { body, .. } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Held { body, .. } => body.size_hint(),
            Kind::Full { data: None } => SizeHint::with_exact(0),
            Kind::Full { data: Some(d) } => {
                SizeHint::with_exact(u64::try_from(bytes::Buf::remaining(d)).unwrap_or(u64::MAX))
            }
        }
    }
}

impl<B: Body> fmt::Debug for AdmittedBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Held { .. } => "held",
            Kind::Full { .. } => "full",
        };
        f.debug_struct("AdmittedBody")
            .field("kind", &kind)
            .field("holds_grant", &self.holds_grant())
            .finish()
    }
}
