//! The one integration-test binary of `admission-tower`: a real axum server on a loopback port,
//! called by hyper's HTTP/1 client, with the monitor's events as the notifications a test waits
//! on (never a sleep). Shared fixtures live here.

mod concurrency;
mod disconnect;
#[cfg(feature = "fleet")]
mod fleet;
mod grpc;
mod propagate;
mod retry;
mod shed;
mod status;
mod streaming;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use admission_accounts::CountingGate;
use admission_core::event::{Event, EventKind, EventSink, RejectReason, SinkError};
use admission_core::{
    Account, AccountStatus, Amount, Answer, Ask, Capability, Category, Demand, JobContext, Refusal,
    Replenishment, WakeFn,
};
use admission_testkit::reference::ReferenceStatus;
use admission_tower::DemandError;
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::routing::get;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::task::JoinHandle;

/// How long a test waits for a notification before declaring itself hung (a watchdog, never an
/// assertion on time).
pub const PATIENCE: Duration = Duration::from_secs(20);

/// A chunk a streaming handler sends, or its failure.
pub type Chunk = Result<Bytes, std::io::Error>;

/// The bodies of the `/stream` route: each request takes the next receiver opened by the test.
#[derive(Clone, Default)]
pub struct Streams(Arc<Mutex<VecDeque<UnboundedReceiver<Chunk>>>>);

impl Streams {
    /// Opens the body of the next `/stream` request; the test sends its chunks, and dropping the
    /// sender ends it.
    pub fn open(&self) -> UnboundedSender<Chunk> {
        let (tx, rx) = unbounded_channel();
        self.0.lock().unwrap().push_back(rx);
        tx
    }
}

async fn stream(State(streams): State<Streams>) -> Body {
    let next = streams.0.lock().unwrap().pop_front();
    match next {
        Some(rx) => Body::from_stream(futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|chunk| (chunk, rx))
        })),
        None => Body::from("no stream was opened"),
    }
}

async fn waited(request: Request) -> String {
    match request.extensions().get::<admission_tower::Waited>() {
        Some(waited) => waited.0.as_millis().to_string(),
        None => "none".to_owned(),
    }
}

/// `/stream` (a streamed body from [`Streams`]), `/hello` (`hello`) and `/waited` (the
/// [`Waited`](admission_tower::Waited) extension in milliseconds).
pub fn routes(streams: &Streams) -> Router {
    Router::new()
        .route("/stream", get(stream))
        .route("/hello", get(|| async { "hello" }))
        .route("/waited", get(waited))
        .with_state(streams.clone())
}

/// A server running `router` on a loopback port chosen by the system; aborted when dropped.
pub struct Server {
    /// Where it listens.
    pub addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Server {
    /// Serves `router` on `127.0.0.1`, port 0.
    pub async fn start(router: Router) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, router).await.unwrap();
        });
        Server { addr, task }
    }

    /// A new connection to the server.
    pub async fn connect(&self) -> Client {
        let stream = TcpStream::connect(self.addr).await.unwrap();
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        let task = tokio::spawn(async move {
            let _ = conn.await;
        });
        Client {
            send: Some(send),
            task,
            sending: None,
        }
    }

    /// `GET path` on a new connection, with `headers`; the response head. The connection lives
    /// as long as the response's body.
    pub async fn get(&self, path: &str, headers: &[(&str, &str)]) -> hyper::Response<Incoming> {
        get_at(self.addr, path, headers).await
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One HTTP/1 connection; dropping it (or [`Client::hang_up`]) closes the socket.
pub struct Client {
    send: Option<SendRequest<Empty<Bytes>>>,
    task: JoinHandle<()>,
    sending: Option<JoinHandle<u16>>,
}

impl Client {
    /// `GET path` with `headers` on this connection; the response head.
    pub async fn get(&mut self, path: &str, headers: &[(&str, &str)]) -> hyper::Response<Incoming> {
        let send = self
            .send
            .as_mut()
            .expect("the request was sent from a task");
        send.send_request(request(path, headers)).await.unwrap()
    }

    /// Sends `GET path` from a task of its own, which ends with the response's status (0 when the
    /// connection is gone).
    pub fn send_in_background(&mut self, path: &str) {
        let mut send = self.send.take().expect("one request a connection");
        let request = request(path, &[]);
        self.sending = Some(tokio::spawn(async move {
            let response = send.send_request(request).await;
            response.map_or(0, |r| r.status().as_u16())
        }));
    }

    /// Closes the connection at once, abandoning whatever it was waiting for.
    pub fn hang_up(self) {
        drop(self);
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        if let Some(sending) = &self.sending {
            sending.abort();
        }
        self.task.abort();
    }
}

/// `GET path` with `headers` on a new connection to `addr`: the response head ([`Server::get`]
/// for a task of its own). The connection lives as long as the response's body.
pub async fn get_at(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> hyper::Response<Incoming> {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    // Ends by itself once the request is dropped and the response read.
    drop(tokio::spawn(conn));
    send.send_request(request(path, headers)).await.unwrap()
}

/// `GET path` with `headers` on a new connection to `addr`: the status, the `Retry-After`
/// header and the body.
pub async fn fetch(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, Option<String>, String) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    let response = send.send_request(request(path, headers)).await.unwrap();
    let status = response.status().as_u16();
    let retry_after = header(&response, "retry-after");
    let body = text(response).await;
    task.abort();
    (status, retry_after, body)
}

/// A demand function asking one permit of `gate` for every request.
pub fn one_permit_of(
    gate: &Arc<CountingGate>,
) -> impl Fn(&Request) -> Result<(Demand, JobContext), DemandError> + Clone + Send + Sync + 'static
{
    let gate = gate.clone();
    move |request: &Request| {
        let ctx = JobContext::new(request.uri().path().to_owned());
        Ok((Demand::new().with(gate.clone(), Amount::ONE), ctx))
    }
}

fn request(path: &str, headers: &[(&str, &str)]) -> hyper::Request<Empty<Bytes>> {
    let mut builder = hyper::Request::get(path).header("host", "localhost");
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(Empty::new()).unwrap()
}

/// The whole body as text.
pub async fn text(response: hyper::Response<Incoming>) -> String {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// A header's value as text, `None` when absent.
pub fn header(response: &hyper::Response<Incoming>, name: &str) -> Option<String> {
    response
        .headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
}

/// The monitor's events, as `(kind, reason)` notifications a test awaits.
pub struct Events {
    rx: UnboundedReceiver<(&'static str, Option<RejectReason>)>,
}

struct Forward(UnboundedSender<(&'static str, Option<RejectReason>)>);

impl EventSink for Forward {
    fn emit(&self, event: &Event) -> Result<(), SinkError> {
        let reason = match &event.kind {
            EventKind::Rejected { reason, .. } => Some(*reason),
            _ => None,
        };
        let _ = self.0.send((event.kind.as_str(), reason));
        Ok(())
    }
}

impl Events {
    /// A sink to install on the monitor, and the receiving end.
    pub fn new() -> (Arc<dyn EventSink>, Events) {
        let (tx, rx) = unbounded_channel();
        (Arc::new(Forward(tx)), Events { rx })
    }

    /// Waits for the next event of `kind`, skipping others; returns its rejection reason.
    pub async fn until(&mut self, kind: &str) -> Option<RejectReason> {
        let next = async {
            loop {
                let (seen, reason) = self.rx.recv().await.expect("the monitor is gone");
                if seen == kind {
                    return reason;
                }
            }
        };
        tokio::time::timeout(PATIENCE, next)
            .await
            .unwrap_or_else(|_| panic!("no `{kind}` event arrived"))
    }
}

/// An account that refuses every demand with one refusal (an open circuit, a spent quota, ...),
/// or that requires a capability no other account provides.
pub struct Refusing {
    /// The account's name.
    pub name: &'static str,
    /// What every ask is answered with.
    pub refusal: Refusal,
    /// A capability the account requires of its demand.
    pub requires: Option<Capability>,
}

impl Refusing {
    /// An account named `name` answering every ask with `refusal`.
    pub fn new(name: &'static str, refusal: Refusal) -> Arc<Refusing> {
        Arc::new(Refusing {
            name,
            refusal,
            requires: None,
        })
    }
}

impl Account for Refusing {
    fn name(&self) -> &str {
        self.name
    }
    fn category(&self) -> Category {
        Category::custom("refusing")
    }
    fn replenishment(&self) -> Replenishment {
        Replenishment::Release
    }
    fn ask(&self, _mine: Amount, _ask: Ask) -> Answer {
        Answer::Never(self.refusal.clone())
    }
    fn give(&self, _amount: Amount) {}
    fn status(&self) -> Box<dyn AccountStatus> {
        Box::new(ReferenceStatus {
            name: self.name.to_owned(),
            category: self.category(),
            capacity: 0,
            available: 0,
        })
    }
    fn on_capacity_change(&self, _wake: Option<WakeFn>) {}
    fn requires(&self) -> Option<Capability> {
        self.requires
    }
}
