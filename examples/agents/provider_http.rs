//! The simulated provider over real HTTP: a [`ProviderServer`] on a loopback port that every
//! process of a run calls through its own [`ProviderClient`], so the organisation's limits are
//! enforced once, across all of them, as a real provider does.
//!
//! The server wraps one [`Provider`] (`provider_sim.rs`) and answers:
//!
//! - `POST /v1/calls` with a JSON call (`model`, `input_tokens`, `max_output_tokens`,
//!   `output_tokens`, `key`, as [`provider_sim::Request`](Request)): the provider's answer with
//!   its real status (200, 429 or 529), its `x-ratelimit-*` headers as HTTP headers (and the
//!   `retry-after` of a 429), and a small JSON body ([`AnswerBody`]). The server holds the answer
//!   for the call's simulated latency, waited on the provider's clock (real time through the
//!   scale on the run's `ScaledClock`; a test's fake clock releases it when advanced), so a call
//!   occupies its HTTP connection for its whole duration, and the provider counts it in flight
//!   until its body has been written.
//! - `GET /v1/stats`: the provider's [`UpstreamStats`] per model, as JSON.
//!
//! An unknown model is a 404, a body that is not a call a 400.
//!
//! The server runs on the tokio runtime that starts it and binds `127.0.0.1:0`; its
//! [`url`](ProviderServer::url) is all a client needs, in this process or another (a fleet's
//! parent starts it, and passes the URL to its members). Its time is the provider's clock, the
//! one process's that started it: the answers' `at_ns` say when, on that clock, each call
//! arrived.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use admission_core::{Clock, Instant, Timer, WakeFn};
use admission_llm::rate_limit_info::RateLimitInfo;
use anyhow::{Context as _, anyhow, bail};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse as _, Response as HttpResponse};
use axum::routing::{get, post};
use http_body_util::{BodyExt as _, Full};
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::{Notify, oneshot, watch};
use tokio::task::JoinHandle;

use crate::provider_sim::{self, Provider, Request, Status, UpstreamStats};

/// The route of a call.
const CALLS_PATH: &str = "/v1/calls";
/// The route of the provider's counters.
const STATS_PATH: &str = "/v1/stats";
/// The HTTP status of an overloaded answer (Anthropic's; not in the IANA registry).
const OVERLOADED: u16 = 529;
/// How long a client keeps an idle connection open.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// A call on the wire: [`provider_sim::Request`](Request) with an owned model.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct CallBody {
    model: String,
    input_tokens: u64,
    max_output_tokens: u64,
    output_tokens: u64,
    key: u64,
}

impl CallBody {
    fn from_request(request: &Request<'_>) -> CallBody {
        CallBody {
            model: request.model.to_owned(),
            input_tokens: request.input_tokens,
            max_output_tokens: request.max_output_tokens,
            output_tokens: request.output_tokens,
            key: request.key,
        }
    }

    fn as_request(&self) -> Request<'_> {
        Request {
            model: &self.model,
            input_tokens: self.input_tokens,
            max_output_tokens: self.max_output_tokens,
            output_tokens: self.output_tokens,
            key: self.key,
        }
    }
}

/// The body of an answer to a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnswerBody {
    /// Tokens the model generated (zero unless the call ran).
    pub output_tokens: u64,
    /// Tokens the provider charged: prompt + declared `max_tokens` on a 200, else zero.
    pub charged_tokens: u64,
    /// The simulated time the server held the answer, in nanoseconds.
    pub latency_ns: u64,
    /// When the call arrived, on the provider's clock (simulated nanoseconds since the run's
    /// start).
    pub at_ns: u64,
}

/// What the server shares with its handlers.
#[derive(Clone)]
struct AppState {
    provider: Arc<Provider>,
    /// Calls the provider has answered, counted before their answers are held.
    answered: Arc<watch::Sender<u64>>,
}

/// The simulated provider served over HTTP/1.1 on a loopback port.
///
/// Dropping it stops the server: it accepts no more connections, closes the idle ones and
/// finishes the answers it is holding in the background; [`shutdown`](Self::shutdown) does the
/// same and waits for it.
#[derive(Debug)]
pub struct ProviderServer {
    addr: SocketAddr,
    url: String,
    answered: watch::Receiver<u64>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl ProviderServer {
    /// Serves `provider` on `127.0.0.1:0` from the current tokio runtime.
    ///
    /// # Errors
    ///
    /// When no loopback port can be bound.
    pub async fn start(provider: Arc<Provider>) -> anyhow::Result<ProviderServer> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the provider server to a loopback port")?;
        let addr = listener
            .local_addr()
            .context("reading the provider server's port")?;
        let (answered_tx, answered) = watch::channel(0);
        let state = AppState {
            provider,
            answered: Arc::new(answered_tx),
        };
        let router = Router::new()
            .route(CALLS_PATH, post(call))
            .route(STATS_PATH, get(stats))
            .with_state(state);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(
            axum::serve(listener, router)
                .with_graceful_shutdown(async {
                    // A dropped sender stops the server as a sent stop does.
                    let _ = stopped.await;
                })
                .into_future(),
        );
        Ok(ProviderServer {
            addr,
            url: format!("http://{addr}"),
            answered,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// The server's base URL, `http://127.0.0.1:PORT`: what a client in any process needs.
    pub fn url(&self) -> &str {
        &self.url
    }

    #[cfg_attr(not(test), expect(dead_code, reason = "read by the tests"))]
    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    #[cfg_attr(not(test), expect(dead_code, reason = "read by the tests"))]
    /// The count of calls the provider has answered (charged or refused), raised as each answer
    /// is decided, before it is held for its latency: a test waits on it to know a call has
    /// been charged.
    pub fn answered(&self) -> watch::Receiver<u64> {
        self.answered.clone()
    }

    /// Stops accepting connections, closes the idle ones, and waits for the answers being held
    /// to be sent (on a fake clock, someone must advance it for that to happen).
    ///
    /// # Errors
    ///
    /// When the server failed or its task panicked.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.task.take() {
            Some(task) => task
                .await
                .context("the provider server's task panicked")?
                .context("the provider server failed"),
            None => Ok(()),
        }
    }
}

impl Drop for ProviderServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// `POST /v1/calls`: one call, answered after its latency.
async fn call(State(state): State<AppState>, body: Bytes) -> HttpResponse {
    let call: CallBody = match serde_json::from_slice(&body) {
        Ok(call) => call,
        Err(error) => {
            return (StatusCode::BAD_REQUEST, format!("not a call: {error}\n")).into_response();
        }
    };
    if !state.provider.serves(&call.model) {
        let text = format!("the provider serves no model `{}`\n", call.model);
        return (StatusCode::NOT_FOUND, text).into_response();
    }
    let request = call.as_request();
    let clock = state.provider.clock().clone();
    let arrived = clock.now();
    let answer = match state.provider.call(&request) {
        Ok(answer) => answer,
        Err(error) => {
            return (StatusCode::INTERNAL_SERVER_ERROR, format!("{error:#}\n")).into_response();
        }
    };
    state.answered.send_modify(|n| *n += 1);
    hold_until(clock.as_ref(), arrived.saturating_add(answer.latency)).await;

    let ran = answer.status == Status::Ok;
    let body = AnswerBody {
        output_tokens: if ran { request.output_tokens } else { 0 },
        charged_tokens: if ran {
            request
                .input_tokens
                .saturating_add(request.max_output_tokens)
        } else {
            0
        },
        latency_ns: u64::try_from(answer.latency.as_nanos()).unwrap_or(u64::MAX),
        at_ns: arrived.as_nanos(),
    };
    let status = match answer.status {
        Status::Ok => StatusCode::OK,
        Status::RateLimited => StatusCode::TOO_MANY_REQUESTS,
        Status::Overloaded => {
            StatusCode::from_u16(OVERLOADED).unwrap_or(StatusCode::SERVICE_UNAVAILABLE)
        }
    };
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    for (name, value) in &answer.headers {
        match HeaderValue::from_str(value) {
            Ok(value) => {
                headers.insert(HeaderName::from_static(name), value);
            }
            Err(_) => {
                let text = format!("header {name} has an unsendable value `{value}`\n");
                return (StatusCode::INTERNAL_SERVER_ERROR, text).into_response();
            }
        }
    }
    let bytes = match serde_json::to_vec(&body) {
        Ok(bytes) => Bytes::from(bytes),
        Err(error) => {
            return (StatusCode::INTERNAL_SERVER_ERROR, format!("{error}\n")).into_response();
        }
    };
    // The answer rides in the body, so the provider counts the call in flight until the body
    // has been written (or the connection dropped).
    let body = Body::new(HeldBody {
        bytes: Some(bytes),
        _answer: answer,
    });
    (status, headers, body).into_response()
}

/// `GET /v1/stats`: the provider's counters per model.
async fn stats(State(state): State<AppState>) -> HttpResponse {
    match serde_json::to_vec(&state.provider.stats()) {
        Ok(bytes) => ([(CONTENT_TYPE, "application/json")], bytes).into_response(),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{error}\n")).into_response(),
    }
}

/// Waits until `clock` reads `deadline`: a real-time sleep of what the clock says that takes
/// (the scaled clock divides by its scale), or, for a clock real time does not move, until it
/// is moved (a fake clock's `advance` wakes its subscribers).
async fn hold_until(clock: &dyn Timer, deadline: Instant) {
    let moved = Arc::new(Notify::new());
    let wake: WakeFn = {
        let moved = moved.clone();
        Arc::new(move || moved.notify_one())
    };
    // Held weakly by the clock: `wake` lives until this wait ends.
    clock.subscribe(&wake);
    loop {
        match clock.real_wait(deadline) {
            Some(wait) if wait.is_zero() => return,
            Some(wait) => {
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = moved.notified() => {}
                }
            }
            // `notify_one` keeps a wake that came before this wait began.
            None => moved.notified().await,
        }
    }
}

/// An answer's one-frame body, holding the provider's [`Response`](provider_sim::Response) (and
/// with it the call's in-flight count) until the body is written and dropped.
struct HeldBody {
    bytes: Option<Bytes>,
    _answer: provider_sim::Response,
}

impl HttpBody for HeldBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.get_mut().bytes.take().map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.bytes.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.bytes.as_ref().map_or(0, |b| b.len() as u64))
    }
}

/// One answer as a client reads it off the wire.
#[derive(Clone, Debug)]
pub struct HttpAnswer {
    /// The HTTP status: 200, 429 or 529.
    pub status: Status,
    /// The rate-limit headers as the provider layer reads them: a 429's as a rate-limited
    /// reading (with its `retry-after`), any other answer's as a capacity reading.
    pub rate_limit: RateLimitInfo,
    #[cfg_attr(not(test), expect(dead_code, reason = "read by the tests"))]
    /// The response's headers as they arrived.
    pub headers: HeaderMap,
    #[cfg_attr(not(test), expect(dead_code, reason = "read by the tests"))]
    /// Tokens the model generated (zero unless the call ran).
    pub output_tokens: u64,
    /// Tokens the provider charged (zero unless the call ran).
    pub charged_tokens: u64,
    #[cfg_attr(not(test), expect(dead_code, reason = "read by the tests"))]
    /// The simulated time the server held the answer.
    pub latency: Duration,
    #[cfg_attr(not(test), expect(dead_code, reason = "read by the tests"))]
    /// When the call arrived, on the provider's clock.
    pub at: Instant,
}

/// A client of a [`ProviderServer`]: HTTP/1.1 over a keep-alive pool, one connection per call in
/// flight. Clones share the pool; two processes have two.
#[derive(Clone, Debug)]
pub struct ProviderClient {
    http: Client<HttpConnector, Full<Bytes>>,
    calls: Uri,
    stats: Uri,
}

impl ProviderClient {
    /// A client of the server at `url` (`http://HOST:PORT`), keeping at most `max_idle` idle
    /// connections open between calls (for 30 s each). Calls need a tokio runtime.
    ///
    /// # Errors
    ///
    /// When `url` is not an `http://` URL of a host.
    pub fn new(url: &str, max_idle: usize) -> anyhow::Result<ProviderClient> {
        let base: Uri = url
            .parse()
            .with_context(|| format!("`{url}` is not a provider URL"))?;
        if base.scheme_str() != Some("http") || base.authority().is_none() {
            bail!("`{url}` is not an http://HOST:PORT URL");
        }
        let base = url.trim_end_matches('/');
        let uri = |path: &str| -> anyhow::Result<Uri> {
            format!("{base}{path}")
                .parse()
                .with_context(|| format!("`{base}{path}` is not a URL"))
        };
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let http = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(max_idle)
            .pool_idle_timeout(IDLE_TIMEOUT)
            .pool_timer(TokioTimer::new())
            .build(connector);
        Ok(ProviderClient {
            http,
            calls: uri(CALLS_PATH)?,
            stats: uri(STATS_PATH)?,
        })
    }

    /// Sends one call; returns when the server has held it for its latency and answered.
    ///
    /// # Errors
    ///
    /// When the server cannot be reached, or answers other than 200, 429 or 529 (an unknown
    /// model is a 404), or with a body that is not an answer.
    pub async fn call(&self, request: &Request<'_>) -> anyhow::Result<HttpAnswer> {
        let body = serde_json::to_vec(&CallBody::from_request(request))
            .context("encoding a provider call")?;
        let http_request = hyper::Request::post(self.calls.clone())
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .context("building a provider call")?;
        let response = self
            .http
            .request(http_request)
            .await
            .with_context(|| format!("calling the provider at {}", self.calls))?;
        let (parts, body) = response.into_parts();
        let bytes = body
            .collect()
            .await
            .with_context(|| format!("reading the provider's answer from {}", self.calls))?
            .to_bytes();
        let status = match parts.status.as_u16() {
            200 => Status::Ok,
            429 => Status::RateLimited,
            OVERLOADED => Status::Overloaded,
            other => bail!(
                "the provider answered {other} to a call of `{}`: {}",
                request.model,
                String::from_utf8_lossy(&bytes).trim_end()
            ),
        };
        let answer: AnswerBody = serde_json::from_slice(&bytes).with_context(|| {
            format!(
                "the provider's answer is not JSON: {}",
                String::from_utf8_lossy(&bytes)
            )
        })?;
        // Resets and retry-afters are durations, never dates: the wall clock is only what a
        // date would be measured from.
        let now = SystemTime::now();
        let rate_limit = match status {
            Status::RateLimited => {
                RateLimitInfo::rate_limited_from_headers(request.model, &parts.headers, now)
            }
            Status::Ok | Status::Overloaded => {
                RateLimitInfo::from_headers(request.model, &parts.headers, now)
            }
        };
        Ok(HttpAnswer {
            status,
            rate_limit,
            headers: parts.headers,
            output_tokens: answer.output_tokens,
            charged_tokens: answer.charged_tokens,
            latency: Duration::from_nanos(answer.latency_ns),
            at: Instant::from_nanos(answer.at_ns),
        })
    }

    /// What the provider saw, per model.
    ///
    /// # Errors
    ///
    /// When the server cannot be reached or answers other than 200 with the stats.
    pub async fn stats(&self) -> anyhow::Result<BTreeMap<String, UpstreamStats>> {
        let request = hyper::Request::get(self.stats.clone())
            .body(Full::new(Bytes::new()))
            .context("building a stats request")?;
        let response = self
            .http
            .request(request)
            .await
            .with_context(|| format!("asking the provider at {} for its stats", self.stats))?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .context("reading the provider's stats")?
            .to_bytes();
        if status != StatusCode::OK {
            return Err(anyhow!(
                "the provider answered {status} to a stats request: {}",
                String::from_utf8_lossy(&bytes).trim_end()
            ));
        }
        serde_json::from_slice(&bytes).context("the provider's stats are not the expected JSON")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use admission_llm::model_spec::ModelCatalog;
    use admission_llm::rate_limit_info::LimitKind;
    use admission_testkit::FakeClock;

    use crate::clock::ScaledClock;
    use crate::provider_sim::OVERLOAD_RATE;
    use crate::rng;

    /// The seed of the provider's draws.
    const SEED: u64 = 7;

    /// The provider really grants 80 % of these: `tokens` 600 tokens and 8 requests a minute
    /// (10 tokens a second: resets and retry-afters come out whole), `requests` 8 requests
    /// with tokens to spare, `single` one call at a time.
    const CATALOG: &str = r#"
        [[models]]
        id = "tokens"
        wire_model = "t"
        tokens_per_minute = 750
        requests_per_minute = 10

        [[models]]
        id = "requests"
        wire_model = "r"
        tokens_per_minute = 100000
        requests_per_minute = 10

        [[models]]
        id = "single"
        wire_model = "s"
        tokens_per_minute = 100000
        requests_per_minute = 100
        max_concurrent = 1
    "#;

    /// A provider on `clock` behind a real server, and a client of it.
    async fn serve(clock: Arc<dyn Timer>) -> (ProviderServer, ProviderClient) {
        let catalog = ModelCatalog::from_toml(CATALOG).unwrap();
        let provider = Arc::new(Provider::new(&catalog, clock, SEED));
        let server = ProviderServer::start(provider).await.unwrap();
        let client = ProviderClient::new(server.url(), 8).unwrap();
        (server, client)
    }

    /// Keys the provider draws no 529 for.
    fn calm_keys() -> impl Iterator<Item = u64> {
        (0..).filter(|&key| rng::unit(rng::hash(SEED, &[key, 529])) >= OVERLOAD_RATE)
    }

    /// A call of `model` charging `input + max_output` tokens.
    fn request(model: &'static str, input: u64, max_output: u64, key: u64) -> Request<'static> {
        Request {
            model,
            input_tokens: input,
            max_output_tokens: max_output,
            output_tokens: max_output / 2,
            key,
        }
    }

    /// Sends `request` from a task of its own.
    fn send(
        client: &ProviderClient,
        request: Request<'static>,
    ) -> JoinHandle<anyhow::Result<HttpAnswer>> {
        let client = client.clone();
        tokio::spawn(async move { client.call(&request).await })
    }

    /// Waits until the provider has answered `n` calls (their answers may still be held).
    async fn answered(server: &ProviderServer, n: u64) {
        let mut answered = server.answered();
        answered.wait_for(|&seen| seen >= n).await.unwrap();
    }

    /// Sends `requests` one after the other, each charged before the next is sent (the fake
    /// clock standing still, so nothing refills between them); returns their pending answers.
    async fn send_in_order(
        server: &ProviderServer,
        client: &ProviderClient,
        requests: impl IntoIterator<Item = Request<'static>>,
    ) -> Vec<JoinHandle<anyhow::Result<HttpAnswer>>> {
        let start = *server.answered().borrow();
        let mut pending = Vec::new();
        for request in requests {
            pending.push(send(client, request));
            answered(server, start + pending.len() as u64).await;
        }
        pending
    }

    /// Advances `clock` past every answer's latency and collects the answers.
    async fn release(
        clock: &FakeClock,
        pending: Vec<JoinHandle<anyhow::Result<HttpAnswer>>>,
    ) -> Vec<HttpAnswer> {
        clock.advance(Duration::from_secs(10));
        let mut answers = Vec::new();
        for call in pending {
            answers.push(call.await.unwrap().unwrap());
        }
        answers
    }

    fn header<'h>(answer: &'h HttpAnswer, name: &str) -> Option<&'h str> {
        answer.headers.get(name).map(|v| v.to_str().unwrap())
    }

    #[tokio::test]
    async fn a_call_within_limits_is_200_with_the_true_limits_and_remaining_falls_by_its_charge() {
        let clock = FakeClock::new();
        let (server, client) = serve(clock.shared()).await;
        let keys = calm_keys().take(3);
        let pending = send_in_order(
            &server,
            &client,
            keys.map(|key| request("tokens", 100, 50, key)),
        )
        .await;
        let answers = release(&clock, pending).await;

        for (i, answer) in (1..).zip(&answers) {
            assert_eq!(answer.status, Status::Ok);
            assert_eq!(header(answer, "x-ratelimit-limit-tokens"), Some("600"));
            assert_eq!(header(answer, "x-ratelimit-limit-requests"), Some("8"));
            assert_eq!(header(answer, "retry-after"), None);
            let info = &answer.rate_limit;
            assert_eq!(info.kind, LimitKind::Capacity);
            assert!(!info.rate_limited);
            assert_eq!(info.token_limit, Some(600));
            assert_eq!(info.token_remaining, Some(600 - 150 * i));
            assert_eq!(info.token_reset, Some(Duration::from_secs(15 * i)));
            assert_eq!(info.request_limit, Some(8));
            assert_eq!(info.request_remaining, Some(8 - i));
            assert_eq!(answer.charged_tokens, 150);
            assert_eq!(answer.output_tokens, 25);
            assert_eq!(answer.at, Instant::ZERO);
        }
        let stats = &client.stats().await.unwrap()["tokens"];
        assert_eq!(
            (stats.accepted, stats.tokens_charged, stats.output_tokens),
            (3, 450, 75)
        );
        assert_eq!(
            (stats.true_tokens_per_minute, stats.true_requests_per_minute),
            (600, 8)
        );
    }

    #[tokio::test]
    async fn calls_past_the_token_budget_are_429_with_a_retry_after_that_is_honest() {
        let clock = FakeClock::new();
        let (server, client) = serve(clock.shared()).await;
        let mut keys = calm_keys();
        let pending = send_in_order(
            &server,
            &client,
            keys.by_ref()
                .take(3)
                .map(|key| request("tokens", 250, 50, key)),
        )
        .await;
        let answers = release(&clock, pending).await;

        let statuses: Vec<_> = answers.iter().map(|a| a.status).collect();
        assert_eq!(statuses, [Status::Ok, Status::Ok, Status::RateLimited]);
        let refused = &answers[2];
        // 300 tokens short at 10 a second.
        assert_eq!(header(refused, "retry-after"), Some("30"));
        assert_eq!(header(refused, "x-ratelimit-remaining-tokens"), Some("0"));
        let info = &refused.rate_limit;
        assert!(info.rate_limited);
        assert_eq!(info.kind, LimitKind::Tokens);
        assert_eq!(info.retry_after, Some(Duration::from_secs(30)));
        assert_eq!(info.token_limit, Some(600));
        assert_eq!((refused.charged_tokens, refused.output_tokens), (0, 0));

        // The clock now reads 10 s: 20 s more refill exactly the 300 the call needs.
        clock.advance(Duration::from_secs(20));
        let pending = send_in_order(
            &server,
            &client,
            keys.take(1).map(|key| request("tokens", 250, 50, key)),
        )
        .await;
        let again = release(&clock, pending).await;
        assert_eq!(again[0].status, Status::Ok);
        assert_eq!(again[0].rate_limit.token_remaining, Some(0));

        let stats = &client.stats().await.unwrap()["tokens"];
        assert_eq!(
            (stats.accepted, stats.rate_limited, stats.tokens_charged),
            (3, 1, 900)
        );
    }

    #[tokio::test]
    async fn calls_past_the_request_budget_are_429_with_a_retry_after() {
        let clock = FakeClock::new();
        let (server, client) = serve(clock.shared()).await;
        let pending = send_in_order(
            &server,
            &client,
            calm_keys()
                .take(9)
                .map(|key| request("requests", 10, 10, key)),
        )
        .await;
        let answers = release(&clock, pending).await;

        for (i, answer) in (1..).zip(&answers[..8]) {
            assert_eq!(answer.status, Status::Ok);
            assert_eq!(answer.rate_limit.request_remaining, Some(8 - i));
        }
        let refused = &answers[8];
        assert_eq!(refused.status, Status::RateLimited);
        // One request at 8 a minute: 7.5 s, sent in whole seconds.
        assert_eq!(header(refused, "retry-after"), Some("8"));
        let info = &refused.rate_limit;
        assert!(info.rate_limited);
        assert_eq!(info.kind, LimitKind::Requests);
        assert_eq!(info.retry_after, Some(Duration::from_secs(8)));
        assert_eq!(info.request_limit, Some(8));
        assert_eq!(info.token_remaining, Some(80_000 - 8 * 20));
    }

    #[tokio::test]
    async fn two_clients_draining_one_model_share_one_budget() {
        let clock = FakeClock::new();
        let (server, first) = serve(clock.shared()).await;
        // A second pool of connections, as a second process would have.
        let second = ProviderClient::new(server.url(), 8).unwrap();
        let pending: Vec<_> = calm_keys()
            .take(20)
            .enumerate()
            .map(|(i, key)| {
                let client = if i % 2 == 0 { &first } else { &second };
                send(client, request("tokens", 100, 0, key))
            })
            .collect();
        answered(&server, 20).await;
        let answers = release(&clock, pending).await;

        let accepted: Vec<_> = answers.iter().filter(|a| a.status == Status::Ok).collect();
        assert_eq!(accepted.len(), 6);
        assert_eq!(accepted.iter().map(|a| a.charged_tokens).sum::<u64>(), 600);
        let mut remaining: Vec<_> = accepted
            .iter()
            .map(|a| a.rate_limit.token_remaining.unwrap())
            .collect();
        remaining.sort_unstable();
        assert_eq!(remaining, [0, 100, 200, 300, 400, 500]);
        assert!(
            answers
                .iter()
                .filter(|a| a.status != Status::Ok)
                .all(|a| a.status == Status::RateLimited && a.rate_limit.rate_limited)
        );
        for client in [&first, &second] {
            let stats = &client.stats().await.unwrap()["tokens"];
            assert_eq!(
                (stats.accepted, stats.rate_limited, stats.tokens_charged),
                (6, 14, 600)
            );
            assert_eq!(stats.max_tokens_in_a_minute, 600);
        }
    }

    #[tokio::test]
    async fn stats_count_the_most_charged_in_any_rolling_minute() {
        let clock = FakeClock::new();
        let (server, client) = serve(clock.shared()).await;
        let mut keys = calm_keys();
        let mut charge = async |calls: usize| {
            let requests: Vec<_> = keys
                .by_ref()
                .take(calls)
                .map(|key| request("tokens", 150, 50, key))
                .collect();
            let pending = send_in_order(&server, &client, requests).await;
            release(&clock, pending).await
        };

        // t = 0: the full bucket, 600 tokens.
        let at_0 = charge(3).await;
        // t = 30 (10 s of release, then 20): 300 refilled, one call of 200 more.
        clock.advance(Duration::from_secs(20));
        let at_30 = charge(1).await;
        // t = 61: 100 + 310 left; the minute (1 s, 61 s] holds 30 s's call and two new ones.
        clock.advance(Duration::from_secs(21));
        let at_61 = charge(2).await;

        let arrivals: Vec<_> = [at_0, at_30, at_61]
            .iter()
            .flatten()
            .map(|a| {
                assert_eq!(a.status, Status::Ok);
                Duration::from_nanos(a.at.as_nanos()).as_secs()
            })
            .collect();
        assert_eq!(arrivals, [0, 0, 0, 30, 61, 61]);
        let stats = &client.stats().await.unwrap()["tokens"];
        assert_eq!((stats.accepted, stats.tokens_charged), (6, 1_200));
        // The minute [0, 30]: the full bucket and one refill, over the 600 limit as a token
        // bucket allows.
        assert_eq!(stats.max_tokens_in_a_minute, 800);
        assert_eq!(stats.max_requests_in_a_minute, 4);
        assert_eq!(stats.true_tokens_per_minute, 600);
        assert_eq!(stats.true_requests_per_minute, 8);
    }

    #[tokio::test]
    async fn an_answer_is_held_until_the_fake_clock_reaches_its_latency() {
        let call = request("tokens", 100, 200, calm_keys().next().unwrap());

        // The same seed and key make the same latency: learn it on a first server.
        let clock = FakeClock::new();
        let (server, client) = serve(clock.shared()).await;
        let first = send_in_order(&server, &client, [call]).await;
        let latency = release(&clock, first).await[0].latency;
        // 300 ms to the first token, 8 ms for each of the 100 output tokens, under 200 ms of
        // jitter.
        assert!(
            latency >= Duration::from_millis(1_100) && latency < Duration::from_millis(1_300),
            "{latency:?}"
        );

        let clock = FakeClock::new();
        let (server, client) = serve(clock.shared()).await;
        let mut held = send_in_order(&server, &client, [call]).await.remove(0);
        clock.advance(latency - Duration::from_nanos(1));
        let early = tokio::time::timeout(Duration::from_millis(200), &mut held).await;
        assert!(early.is_err(), "the answer arrived before its latency");
        let stats = &client.stats().await.unwrap()["tokens"];
        assert_eq!((stats.accepted, stats.peak_in_flight), (1, 1));

        clock.advance(Duration::from_nanos(1));
        let answer = held.await.unwrap().unwrap();
        assert_eq!(answer.status, Status::Ok);
        assert_eq!(answer.latency, latency);
    }

    #[tokio::test]
    async fn an_answer_is_held_for_its_latency_in_real_time_on_the_scaled_clock() {
        let clock = ScaledClock::new(60);
        let (_server, client) = serve(clock.clone()).await;
        let call = request("tokens", 100, 200, calm_keys().next().unwrap());

        let sent = std::time::Instant::now();
        let answer = client.call(&call).await.unwrap();
        let real = sent.elapsed();

        assert_eq!(answer.status, Status::Ok);
        assert!(answer.latency >= Duration::from_millis(1_100));
        let arrived = Duration::from_nanos(answer.at.as_nanos());
        assert!(
            clock.elapsed() >= arrived + answer.latency,
            "answered at {:?}, before {arrived:?} + {:?}",
            clock.elapsed(),
            answer.latency
        );
        assert!(
            real >= clock.to_real(answer.latency),
            "answered after {real:?} real, under {:?}",
            clock.to_real(answer.latency)
        );
    }

    #[tokio::test]
    async fn a_held_call_keeps_its_concurrency_slot_until_answered() {
        let clock = FakeClock::new();
        let (server, client) = serve(clock.shared()).await;
        let mut keys = calm_keys();
        let pending = send_in_order(
            &server,
            &client,
            keys.by_ref()
                .take(2)
                .map(|key| request("single", 10, 10, key)),
        )
        .await;
        let answers = release(&clock, pending).await;
        assert_eq!(answers[0].status, Status::Ok);
        assert_eq!(answers[1].status, Status::Overloaded);
        assert_eq!(answers[1].rate_limit.token_limit, None);

        // The first answer sent, the slot is free again.
        let pending = send_in_order(
            &server,
            &client,
            keys.take(1).map(|key| request("single", 10, 10, key)),
        )
        .await;
        assert_eq!(release(&clock, pending).await[0].status, Status::Ok);
        let stats = &client.stats().await.unwrap()["single"];
        assert_eq!(
            (
                stats.accepted,
                stats.overloaded,
                stats.over_concurrency,
                stats.peak_in_flight
            ),
            (2, 1, 1, 1)
        );
    }

    #[tokio::test]
    async fn an_overload_draw_is_a_529_without_rate_limit_headers() {
        let clock = FakeClock::new();
        let (server, client) = serve(clock.shared()).await;
        let stormy = (0..)
            .find(|&key| rng::unit(rng::hash(SEED, &[key, 529])) < OVERLOAD_RATE)
            .unwrap();
        let pending = send_in_order(&server, &client, [request("tokens", 10, 10, stormy)]).await;
        let answer = &release(&clock, pending).await[0];
        assert_eq!(answer.status, Status::Overloaded);
        assert_eq!(answer.latency, Duration::from_millis(800));
        assert_eq!(header(answer, "x-ratelimit-limit-tokens"), None);
        assert!(!answer.rate_limit.rate_limited);
        assert_eq!(answer.rate_limit.token_limit, None);
        let stats = &client.stats().await.unwrap()["tokens"];
        assert_eq!(
            (stats.accepted, stats.overloaded, stats.over_concurrency),
            (0, 1, 0)
        );
    }

    #[tokio::test]
    async fn an_unknown_model_is_an_error_naming_it_and_a_stopped_server_refuses() {
        let clock = FakeClock::new();
        let (server, client) = serve(clock.shared()).await;
        assert!(server.addr().ip().is_loopback());
        assert_eq!(server.url(), format!("http://{}", server.addr()));
        let error = client
            .call(&request("nope", 1, 1, 0))
            .await
            .unwrap_err()
            .to_string();
        assert!(error.contains("404") && error.contains("`nope`"), "{error}");

        server.shutdown().await.unwrap();
        let error = client.stats().await.unwrap_err();
        assert!(
            format!("{error:#}").contains("asking the provider"),
            "{error:#}"
        );
    }
}
