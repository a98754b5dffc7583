//! Per-tenant traffic quotas shared by a fleet (feature `fleet`): a request decorator and a frame
//! decorator over [`RedisAdmission`]'s quotas.
//!
//! [`QuotaLayer`] charges, for each request, one request to its tenant's per-minute quota
//! ([`RedisAdmission::charge_request`]) before the inner service sees it, and then every data
//! frame of the response body to the tenant's per-hour delivered-bytes quota
//! ([`RedisAdmission::charge_delivered`]) just before the frame leaves ([`QuotaBody`]). Both
//! quotas are counted in Redis on the server's clock, so every instance of the service shares
//! them; the cell's config must enable them ([`RedisAdmissionConfig::quotas`](admission_redis::RedisAdmissionConfig::quotas)).
//!
//! # Requests
//!
//! | charge | response |
//! |---|---|
//! | accepted | the inner service's |
//! | quota exceeded ([`QuotaError::Exceeded`]) | 429, `Retry-After` = whole seconds until the window ends (at least 1) |
//! | Redis unavailable ([`QuotaError::Unavailable`]) | 503, `Retry-After: 1` |
//! | quotas not enabled in the config, or the cell's config changed under this instance ([`QuotaError::Mismatch`]): the service is built or deployed wrong | 500, no `Retry-After` |
//! | the request names no tenant (the tenant function returned `None`) | 400 |
//!
//! A configuration mismatch is a 500, not a 503: every instance of the service that was built
//! with the other config gets the same answer on every retry until it is redeployed, so a
//! `Retry-After` would only invite a retry storm. Only an unreachable Redis (which a retry a
//! second later may find back) is a 503.
//!
//! A request without a tenant is refused rather than passed through: a quota that a caller
//! escapes by not naming itself is no quota.
//!
//! Beside an [`AdmissionLayer`](crate::AdmissionLayer), the order decides what a request that
//! can never fit meets first. With axum's `Router::layer` the layer added last runs first:
//! `.layer(QuotaLayer::new(..)).layer(admission)` admits first, so a demand that can never fit
//! is a 413 or 422 before the tenant's quota is charged (never a 429 it would retry), and a
//! request shed from the line is not charged either; the grant is then held while the charge
//! makes its round trip to Redis. The other order charges every request, and a tenant past its
//! quota is refused without joining the line. Resolve and authenticate the caller in a layer
//! outside this one, and return its tenant from the request (an extension, a header the
//! authentication layer set). Refusals have a one-line plain-text body.
//!
//! # gRPC
//!
//! With [`QuotaLayer::grpc_responses`] the same refusals are gRPC statuses, as a trailers-only
//! response (HTTP 200, `content-type: application/grpc`, the status in the headers, no body;
//! see [`grpc_status`]):
//!
//! | charge | `grpc-status` | `grpc-retry-pushback-ms` |
//! |---|---|---|
//! | quota exceeded | `RESOURCE_EXHAUSTED` (8) | until the window ends |
//! | Redis unavailable | `UNAVAILABLE` (14) | 1000 |
//! | quotas not enabled in the config, or the cell's config changed under this instance | `INTERNAL` (13) | none |
//! | the request names no tenant | `INVALID_ARGUMENT` (3) | none |
//!
//! `grpc-message` is the refusal's line, percent-encoded. A frame whose charge is refused ends
//! the stream with trailers carrying the same status instead of an error, so a gRPC client reads
//! `RESOURCE_EXHAUSTED` (or `UNAVAILABLE`) where the response stopped; the inner service's own
//! trailers are not sent after it. A response let through declares those trailers in a
//! `Trailer` header, which HTTP/1 needs before it sends them.
//!
//! # Frames
//!
//! Each non-empty data frame of the inner body is held back until its length is charged: the
//! charge runs on a spawned tokio task (so the body stays `Send + Sync`) and the body yields the
//! frame only once Redis accepted it. The stream is thus backpressured by the charge, and no
//! byte leaves uncharged. When a charge is refused (the quota is spent mid-stream, or Redis
//! fails), the frame is not sent and the body ends with a [`QuotaBodyError`]: the server aborts
//! the response (HTTP/1 closes the connection; the client sees a truncated body). A body dropped
//! while a charge is in flight lets the charge finish: the bytes of that frame are counted
//! though not delivered (at most one frame per response).
//!
//! # Examples
//!
//! ```no_run
//! use admission_redis::{Ceilings, Quotas, RedisAdmission, RedisAdmissionConfig};
//! use admission_tower::fleet::QuotaLayer;
//! use axum::{Router, extract::Request, routing::get};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let ceilings = Ceilings {
//!     service_bytes: 1 << 30,
//!     service_transfers: 64,
//!     tenant_bytes: 1 << 28,
//!     tenant_transfers: 16,
//!     backend_transfers: 32,
//! };
//! let mut config = RedisAdmissionConfig::new("127.0.0.1", 6379, "downloads", ceilings);
//! config.quotas = Some(Quotas { requests_per_minute: 600, bytes_per_hour: 10 << 30 });
//! let fleet = RedisAdmission::connect(config).await?;
//! // The tenant an authentication layer outside this one resolved, as a header it set.
//! let tenant = |request: &Request| {
//!     let value = request.headers().get("x-tenant")?;
//!     value.to_str().ok().map(str::to_owned)
//! };
//! let app: Router = Router::new()
//!     .route("/blob", get(|| async { "the blob's bytes" }))
//!     .layer(QuotaLayer::new(fleet, tenant));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! axum::serve(listener, app).await?;
//! # Ok(()) }
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use admission_redis::{QuotaError, QuotaUse, RedisAdmission};
use bytes::{Buf, Bytes};
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::task::JoinHandle;
use tower::{Layer, Service};

/// A boxed error, as http bodies carry them.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A tower layer charging each request, and each data frame of its response, to the request's
/// tenant's quotas on Redis (see the [module](self)).
///
/// `T` names the request's tenant: `Fn(&Request<B>) -> Option<String>`; `None` is a 400.
pub struct QuotaLayer<T> {
    fleet: RedisAdmission,
    tenant: Arc<T>,
    answers: Answers,
}

/// How refusals are answered.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Answers {
    Http,
    Grpc,
}

impl<T> QuotaLayer<T> {
    /// Charges `fleet`'s quotas, to the tenant `tenant` names for each request; refusals are
    /// HTTP statuses.
    pub fn new(fleet: RedisAdmission, tenant: T) -> QuotaLayer<T> {
        QuotaLayer {
            fleet,
            tenant: Arc::new(tenant),
            answers: Answers::Http,
        }
    }

    /// Answers refusals as gRPC statuses, and ends a stream whose frame was refused with
    /// trailers carrying the status (see the [module](self)'s table).
    pub fn grpc_responses(mut self) -> QuotaLayer<T> {
        self.answers = Answers::Grpc;
        self
    }
}

impl<T> Clone for QuotaLayer<T> {
    fn clone(&self) -> Self {
        QuotaLayer {
            fleet: self.fleet.clone(),
            tenant: self.tenant.clone(),
            answers: self.answers,
        }
    }
}

impl<T> fmt::Debug for QuotaLayer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QuotaLayer")
            .field("cell", &self.fleet.config().cell)
            .field("answers", &self.answers)
            .finish_non_exhaustive()
    }
}

impl<S, T> Layer<S> for QuotaLayer<T> {
    type Service = Quota<S, T>;

    fn layer(&self, inner: S) -> Quota<S, T> {
        Quota {
            inner,
            fleet: self.fleet.clone(),
            tenant: self.tenant.clone(),
            answers: self.answers,
        }
    }
}

/// The service [`QuotaLayer`] builds around `S`.
pub struct Quota<S, T> {
    inner: S,
    fleet: RedisAdmission,
    tenant: Arc<T>,
    answers: Answers,
}

impl<S: Clone, T> Clone for Quota<S, T> {
    fn clone(&self) -> Self {
        Quota {
            inner: self.inner.clone(),
            fleet: self.fleet.clone(),
            tenant: self.tenant.clone(),
            answers: self.answers,
        }
    }
}

impl<S, T> fmt::Debug for Quota<S, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Quota")
            .field("cell", &self.fleet.config().cell)
            .field("answers", &self.answers)
            .finish_non_exhaustive()
    }
}

/// The future of [`Quota`]'s response.
pub type QuotaFuture<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<QuotaBody<B>>, E>> + Send + 'static>>;

impl<S, T, ReqBody, ResBody> Service<Request<ReqBody>> for Quota<S, T>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    T: Fn(&Request<ReqBody>) -> Option<String> + Send + Sync + 'static,
    ReqBody: Send + 'static,
    ResBody: Body<Data = Bytes>,
{
    type Response = Response<QuotaBody<ResBody>>;
    type Error = S::Error;
    type Future = QuotaFuture<ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The clone is the one not yet ready; the ready one serves this request.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let fleet = self.fleet.clone();
        let tenant = (self.tenant)(&request);
        let answers = self.answers;
        Box::pin(async move {
            let Some(tenant) = tenant else {
                return Ok(match answers {
                    Answers::Http => plain(
                        StatusCode::BAD_REQUEST,
                        None,
                        format!("quota refused: {NO_TENANT}\n"),
                    ),
                    Answers::Grpc => trailers_only(crate::grpc::INVALID_ARGUMENT, None, NO_TENANT),
                });
            };
            if let Err(error) = fleet.charge_request(&tenant).await {
                return Ok(match answers {
                    Answers::Http => refusal(&error),
                    Answers::Grpc => trailers_only(
                        grpc_status(&error),
                        grpc_pushback_ms(&error),
                        &error.to_string(),
                    ),
                });
            }
            let mut response = inner.call(request).await?;
            if answers == Answers::Grpc {
                // The trailers a refused frame may end the stream with; HTTP/1 sends only
                // trailers the response declared.
                response.headers_mut().append(
                    http::header::TRAILER,
                    HeaderValue::from_static("grpc-status, grpc-message, grpc-retry-pushback-ms"),
                );
            }
            let tenant: Arc<str> = tenant.into();
            Ok(response.map(|body| QuotaBody::charged(body, fleet, tenant, answers)))
        })
    }
}

/// The refusal's line for a request naming no tenant.
const NO_TENANT: &str = "the request names no tenant";

/// The `grpc-status` a refused charge maps to (see the [module](self)'s gRPC table):
/// `RESOURCE_EXHAUSTED` for a spent quota, `INTERNAL` for quotas not enabled or a config
/// mismatch, `UNAVAILABLE` otherwise.
pub fn grpc_status(error: &QuotaError) -> u16 {
    match error {
        QuotaError::Exceeded { .. } => crate::grpc::RESOURCE_EXHAUSTED,
        QuotaError::NotEnabled | QuotaError::Mismatch { .. } => crate::grpc::INTERNAL,
        _ => crate::grpc::UNAVAILABLE,
    }
}

/// The `grpc-retry-pushback-ms` of a refused charge: the milliseconds until the window ends for
/// a spent quota (at least 1), 1000 for an unavailable coordinator, none for a misconfigured
/// service (quotas not enabled, a config mismatch).
pub fn grpc_pushback_ms(error: &QuotaError) -> Option<u64> {
    match error {
        QuotaError::Exceeded { retry_after, .. } => Some(
            u64::try_from(retry_after.as_millis())
                .unwrap_or(u64::MAX)
                .max(1),
        ),
        QuotaError::NotEnabled | QuotaError::Mismatch { .. } => None,
        _ => Some(1_000),
    }
}

/// The gRPC status headers (or trailers): `grpc-status`, `grpc-message` (percent-encoded) and
/// `grpc-retry-pushback-ms` when there is one.
fn grpc_headers(code: u16, pushback_ms: Option<u64>, message: &str) -> http::HeaderMap {
    let mut headers = http::HeaderMap::new();
    headers.insert("grpc-status", HeaderValue::from(code));
    let message = HeaderValue::try_from(crate::grpc::percent_encode(&format!(
        "quota refused: {message}"
    )))
    .unwrap_or_else(|_| HeaderValue::from_static("quota refused"));
    headers.insert("grpc-message", message);
    if let Some(millis) = pushback_ms {
        headers.insert("grpc-retry-pushback-ms", HeaderValue::from(millis));
    }
    headers
}

/// A trailers-only gRPC response with the status.
fn trailers_only<B: Body<Data = Bytes>>(
    code: u16,
    pushback_ms: Option<u64>,
    message: &str,
) -> Response<QuotaBody<B>> {
    let mut response = Response::new(QuotaBody::full(Bytes::new()));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.extend(grpc_headers(code, pushback_ms, message));
    response
}

/// The status a refused charge maps to (see the [module](self)'s table): 429 for a spent quota,
/// 500 for quotas not enabled or a config mismatch, 503 otherwise.
pub fn status(error: &QuotaError) -> StatusCode {
    match error {
        QuotaError::Exceeded { .. } => StatusCode::TOO_MANY_REQUESTS,
        QuotaError::NotEnabled | QuotaError::Mismatch { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// The `Retry-After` of a refused charge, in whole seconds (at least 1): until the window ends
/// for an exceeded quota, 1 for an unavailable coordinator, none for a misconfigured service
/// (quotas not enabled, a config mismatch).
pub fn retry_after(error: &QuotaError) -> Option<u64> {
    match error {
        QuotaError::Exceeded { retry_after, .. } => Some(
            u64::try_from(retry_after.as_millis().div_ceil(1000))
                .unwrap_or(u64::MAX)
                .max(1),
        ),
        QuotaError::NotEnabled | QuotaError::Mismatch { .. } => None,
        _ => Some(1),
    }
}

fn refusal<B: Body<Data = Bytes>>(error: &QuotaError) -> Response<QuotaBody<B>> {
    plain(
        status(error),
        retry_after(error),
        format!("quota refused: {error}\n"),
    )
}

fn plain<B: Body<Data = Bytes>>(
    status: StatusCode,
    retry_after: Option<u64>,
    text: String,
) -> Response<QuotaBody<B>> {
    let mut response = Response::new(QuotaBody::full(Bytes::from(text)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if let Some(secs) = retry_after {
        headers.insert(RETRY_AFTER, HeaderValue::from(secs));
    }
    response
}

/// Why a [`QuotaBody`] ended with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QuotaBodyError {
    /// The inner body failed.
    #[error("response body failed: {0}")]
    Body(#[source] BoxError),
    /// A frame's charge was refused: the delivered-bytes quota is spent, or Redis failed. The
    /// frame was not sent.
    #[error("delivered bytes not charged: {0}")]
    Quota(#[source] QuotaError),
    /// The task charging a frame panicked or was cancelled (its runtime is shutting down).
    #[error("delivered bytes not charged: the charging task ended: {0}")]
    Charge(#[source] tokio::task::JoinError),
}

type Charge = JoinHandle<Result<QuotaUse, QuotaError>>;

pin_project! {
    /// The inner service's body with each data frame charged to the tenant's delivered-bytes
    /// quota before it is yielded, or the one-chunk body of a refusal.
    ///
    /// # Cancel safety
    ///
    /// Dropping the body while a frame's charge is in flight lets the charge finish (that frame
    /// is counted, not sent); nothing else is charged.
    pub struct QuotaBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Charged {
            #[pin]
            body: B,
            fleet: RedisAdmission,
            tenant: Arc<str>,
            // The frame held back while its charge runs.
            pending: Option<(Frame<Bytes>, Charge)>,
            // Set once the body failed or a charge was refused: nothing more is yielded.
            failed: bool,
            // gRPC: a refused charge ends the stream with trailers carrying its status.
            answers: Answers,
        },
        Full {
            data: Option<Bytes>,
        },
    }
}

impl<B> QuotaBody<B> {
    fn charged(body: B, fleet: RedisAdmission, tenant: Arc<str>, answers: Answers) -> QuotaBody<B> {
        QuotaBody {
            kind: Kind::Charged {
                body,
                fleet,
                tenant,
                pending: None,
                failed: false,
                answers,
            },
        }
    }

    /// One chunk (none when empty).
    fn full(data: Bytes) -> QuotaBody<B> {
        QuotaBody {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }
}

impl<B> Body for QuotaBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = QuotaBodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, QuotaBodyError>>> {
        let (mut body, fleet, tenant, pending, failed, answers) =
            match self.project().kind.project() {
                KindProj::Full { data } => {
                    return Poll::Ready(data.take().map(|d| Ok(Frame::data(d))));
                }
                KindProj::Charged {
                    body,
                    fleet,
                    tenant,
                    pending,
                    failed,
                    answers,
                } => (body, fleet, tenant, pending, failed, *answers),
            };
        loop {
            if *failed {
                return Poll::Ready(None);
            }
            if let Some((_, charge)) = pending.as_mut() {
                let charged = ready!(Pin::new(charge).poll(cx));
                let (frame, _) = pending.take().expect("a pending frame");
                return Poll::Ready(Some(match charged {
                    Ok(Ok(_)) => Ok(frame),
                    Ok(Err(error)) if answers == Answers::Grpc => {
                        *failed = true;
                        let status = grpc_status(&error);
                        let pushback = grpc_pushback_ms(&error);
                        Ok(Frame::trailers(grpc_headers(
                            status,
                            pushback,
                            &format!("delivered bytes not charged: {error}"),
                        )))
                    }
                    Ok(Err(error)) => {
                        *failed = true;
                        Err(QuotaBodyError::Quota(error))
                    }
                    Err(join) => {
                        *failed = true;
                        Err(QuotaBodyError::Charge(join))
                    }
                }));
            }
            let frame = match ready!(body.as_mut().poll_frame(cx)) {
                None => return Poll::Ready(None),
                Some(Err(error)) => {
                    *failed = true;
                    return Poll::Ready(Some(Err(QuotaBodyError::Body(error.into()))));
                }
                Some(Ok(frame)) => frame,
            };
            let len = frame.data_ref().map_or(0, Buf::remaining);
            if len == 0 {
                return Poll::Ready(Some(Ok(frame)));
            }
            let fleet = fleet.clone();
            let tenant = tenant.clone();
            let bytes = u64::try_from(len).unwrap_or(u64::MAX);
            let charge = tokio::spawn(async move { fleet.charge_delivered(&tenant, bytes).await });
            *pending = Some((frame, charge));
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Charged {
                body,
                pending,
                failed,
                ..
            } => *failed || (pending.is_none() && body.is_end_stream()),
            Kind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Charged {
                body,
                pending: None,
                ..
            } => body.size_hint(),
            // A held frame's bytes are no longer in the inner body's hint.
            Kind::Charged { .. } => SizeHint::default(),
            Kind::Full { data: None } => SizeHint::with_exact(0),
            Kind::Full { data: Some(d) } => {
                SizeHint::with_exact(u64::try_from(d.len()).unwrap_or(u64::MAX))
            }
        }
    }
}

impl<B> fmt::Debug for QuotaBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Charged { pending, .. } if pending.is_some() => "charging",
            Kind::Charged { .. } => "charged",
            Kind::Full { .. } => "full",
        };
        f.debug_struct("QuotaBody").field("kind", &kind).finish()
    }
}
