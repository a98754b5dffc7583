//! What a refusal becomes: an error out of the service ([`Propagate`], the default), or a
//! response built by a handler ([`Respond`]: the `http` and `grpc` features' mappings, or the
//! user's own).

use bytes::Bytes;
use http::Response;
use http_body::Body;

use crate::body::AdmittedBody;
use crate::error::{AdmissionError, Refused};

/// Turns a refusal, or the inner service's error, into what the service returns.
///
/// Implemented by [`Propagate`] and [`Respond`]; a policy of one's own (logging, counting) can
/// implement it too.
pub trait OnRefusal<B: Body, E> {
    /// The service's error type under this policy.
    type Error;

    /// The request was refused; the inner service was not called.
    ///
    /// # Errors
    ///
    /// When the policy reports refusals as errors.
    fn refused(&self, refused: Refused) -> Result<Response<AdmittedBody<B>>, Self::Error>;

    /// The inner service failed (its grant is already released).
    fn failed(&self, error: E) -> Self::Error;
}

/// The default policy: a refusal is an [`AdmissionError::Refused`], the inner service's error an
/// [`AdmissionError::Inner`]. For stacks that handle errors themselves (axum's
/// `HandleErrorLayer`, a client-side retry).
#[derive(Clone, Copy, Debug, Default)]
pub struct Propagate;

impl<B: Body, E> OnRefusal<B, E> for Propagate {
    type Error = AdmissionError<E>;

    fn refused(&self, refused: Refused) -> Result<Response<AdmittedBody<B>>, Self::Error> {
        Err(AdmissionError::Refused(refused))
    }

    fn failed(&self, error: E) -> Self::Error {
        AdmissionError::Inner(error)
    }
}

/// A refusal becomes the response `handler` builds (its `String` body becomes the response's one
/// chunk, and the [`Refused`] rides along in the response's extensions); the inner service's
/// errors pass through unchanged, so a service that never fails stays infallible (what axum's
/// `Router::layer` requires).
///
/// The features' mappings are handlers (`admission_tower::http::response`,
/// `admission_tower::grpc::response`), so a handler of one's own can change one case and leave
/// the rest to them.
#[derive(Clone, Copy, Debug)]
pub struct Respond<H> {
    handler: H,
}

/// The policy the features' mappings install: [`Respond`] with a plain function.
pub type RespondFn = Respond<fn(&Refused) -> Response<String>>;

impl<H> Respond<H> {
    /// A policy answering refusals with `handler`'s responses.
    pub fn new(handler: H) -> Respond<H> {
        Respond { handler }
    }
}

impl<B, E, H> OnRefusal<B, E> for Respond<H>
where
    B: Body,
    B::Data: From<Bytes>,
    H: Fn(&Refused) -> Response<String>,
{
    type Error = E;

    fn refused(&self, refused: Refused) -> Result<Response<AdmittedBody<B>>, E> {
        let (mut parts, text) = (self.handler)(&refused).into_parts();
        parts.extensions.insert(refused);
        let data = (!text.is_empty()).then(|| B::Data::from(Bytes::from(text)));
        Ok(Response::from_parts(parts, AdmittedBody::full(data)))
    }

    fn failed(&self, error: E) -> E {
        error
    }
}
