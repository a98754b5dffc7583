//! Feature `fleet`: [`QuotaLayer`] against the Redis `cargo xtask ci` starts
//! (`ADMISSION_REDIS_URL`). Requests within the per-minute quota pass and the next one is a 429
//! with the window's `Retry-After`; every byte of a response body is charged, exactly; a spent
//! byte quota ends the body; a request naming no tenant is a 400; a Redis gone away is a 503.
//! With `grpc_responses` the same refusals are gRPC statuses (`RESOURCE_EXHAUSTED` with the
//! window's pushback, `INVALID_ARGUMENT`, `UNAVAILABLE`), and a spent byte quota ends the stream
//! with trailers carrying `RESOURCE_EXHAUSTED`. A cell whose config changed under the instance is
//! a 500 (`INTERNAL`), with no retry time.
//!
//! Without its server a test fails, saying how to start it; a plain `cargo nextest run` skips
//! these tests (`.config/nextest.toml`), `cargo xtask test` starts the servers and runs them.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use admission_redis::{Ceilings, Quotas, RedisAdmission, RedisAdmissionConfig};
use admission_tower::fleet::QuotaLayer;
use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::routing::get;
use bytes::Bytes;
use http_body_util::BodyExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::grpc::grpc_get;
use crate::{PATIENCE, Server, fetch};

/// The chunks `/chunks` sends, in order.
const CHUNKS: [usize; 4] = [5, 1_000, 17, 64 * 1024];

/// The shared server's host and port (a failure without it).
fn redis(test: &str) -> (String, u16) {
    admission_testkit::services::redis(test)
}

/// A config for a cell no other test (or earlier run) uses, with `quotas` and short timeouts.
fn config(host: &str, port: u16, test: &str, quotas: Quotas) -> RedisAdmissionConfig {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let cell = format!(
        "tower-{test}-{}-{}-{nanos}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let ceilings = Ceilings {
        service_bytes: 1 << 30,
        service_transfers: 64,
        tenant_bytes: 1 << 30,
        tenant_transfers: 64,
        backend_transfers: 64,
    };
    let mut config = RedisAdmissionConfig::new(host, port, cell, ceilings);
    config.key_prefix = "it".into();
    config.quotas = Some(quotas);
    config.lease_ttl = Duration::from_secs(3);
    config.renew_every = Duration::from_secs(1);
    config.connect_timeout = Duration::from_millis(300);
    config.response_timeout = Duration::from_millis(700);
    config.recover_created_cells = false;
    config
}

async fn connect(config: RedisAdmissionConfig) -> RedisAdmission {
    RedisAdmission::connect(config)
        .await
        .expect("connects to the test server")
}

/// Waits out the current server-time minute when less than 10 s of it is left, so that a test's
/// requests all fall in one window (a probe tenant's charge reads the time left).
async fn clear_of_window_end(fleet: &RedisAdmission) {
    let probe = fleet
        .charge_request("probe")
        .await
        .expect("charges the probe");
    if probe.window_left < Duration::from_secs(10) {
        tokio::time::sleep(probe.window_left + Duration::from_millis(100)).await;
    }
}

/// `/hello` and `/chunks` ([`CHUNKS`] as separate frames), behind a [`QuotaLayer`] charging
/// the tenant of the `x-tenant` header.
fn app(fleet: RedisAdmission) -> Router {
    routes().layer(QuotaLayer::new(fleet, tenant))
}

/// [`app`] answering refusals as gRPC statuses.
fn grpc_app(fleet: RedisAdmission) -> Router {
    routes().layer(QuotaLayer::new(fleet, tenant).grpc_responses())
}

/// The tenant of the `x-tenant` header.
fn tenant(request: &Request) -> Option<String> {
    let value = request.headers().get("x-tenant")?;
    value.to_str().ok().map(str::to_owned)
}

fn routes() -> Router {
    Router::new()
        .route("/hello", get(|| async { "hello" }))
        .route(
            "/chunks",
            get(|| async {
                let chunks = CHUNKS.map(|len| Ok::<_, Infallible>(Bytes::from(vec![b'x'; len])));
                Body::from_stream(futures::stream::iter(chunks))
            }),
        )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_within_the_quota_pass_and_the_next_is_429() {
    let (host, port) = redis("requests_within_the_quota_pass_and_the_next_is_429");
    const N: u64 = 3;
    let quotas = Quotas {
        requests_per_minute: N,
        bytes_per_hour: 1 << 30,
    };
    let fleet = connect(config(&host, port, "requests", quotas)).await;
    clear_of_window_end(&fleet).await;
    let server = Server::start(app(fleet.clone())).await;

    for i in 0..N {
        let (status, retry_after, body) = fetch(server.addr, "/hello", &[("x-tenant", "a")]).await;
        assert_eq!((status, body.as_str()), (200, "hello"), "request {i}");
        assert_eq!(retry_after, None);
    }
    let (status, retry_after, body) = fetch(server.addr, "/hello", &[("x-tenant", "a")]).await;
    assert_eq!(status, 429, "{body}");
    let secs: u64 = retry_after.expect("a 429 has Retry-After").parse().unwrap();
    assert!((1..=60).contains(&secs), "Retry-After {secs}");
    assert!(
        body.contains("requests-per-minute quota exceeded"),
        "{body}"
    );

    // Another tenant has a quota of its own.
    let (status, _, _) = fetch(server.addr, "/hello", &[("x-tenant", "b")]).await;
    assert_eq!(status, 200);
    // The refused request was not counted: the tenant has used exactly N.
    let refused = fleet.charge_request("a").await.unwrap_err();
    assert!(
        matches!(
            refused,
            admission_redis::QuotaError::Exceeded {
                used: N,
                limit: N,
                ..
            }
        ),
        "{refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_delivered_byte_is_charged_exactly() {
    let (host, port) = redis("every_delivered_byte_is_charged_exactly");
    let quotas = Quotas {
        requests_per_minute: 100,
        bytes_per_hour: 1 << 30,
    };
    let fleet = connect(config(&host, port, "bytes", quotas)).await;
    clear_of_window_end(&fleet).await;
    let server = Server::start(app(fleet.clone())).await;

    let mut sent = 0;
    for _ in 0..2 {
        let (status, _, body) = fetch(server.addr, "/chunks", &[("x-tenant", "c")]).await;
        assert_eq!(status, 200);
        sent += body.len() as u64;
    }
    let (_, _, hello) = fetch(server.addr, "/hello", &[("x-tenant", "c")]).await;
    sent += hello.len() as u64;
    assert_eq!(sent, 2 * CHUNKS.iter().sum::<usize>() as u64 + 5);

    // Each frame is charged before it is yielded: once the bodies are read, all is counted.
    let used = fleet.charge_delivered("c", 0).await.unwrap();
    assert_eq!(used.used, sent);
    let other = fleet.charge_delivered("d", 0).await.unwrap();
    assert_eq!(other.used, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_byte_quota_ends_the_body() {
    let (host, port) = redis("a_spent_byte_quota_ends_the_body");
    // The first two chunks fit (1005 bytes), the third does not.
    let quotas = Quotas {
        requests_per_minute: 100,
        bytes_per_hour: 1_010,
    };
    let fleet = connect(config(&host, port, "spent", quotas)).await;
    clear_of_window_end(&fleet).await;
    let server = Server::start(app(fleet.clone())).await;

    let response = server.get("/chunks", &[("x-tenant", "e")]).await;
    assert_eq!(response.status().as_u16(), 200);
    let mut body = response.into_body();
    let mut received = 0;
    let ended = tokio::time::timeout(PATIENCE, async {
        loop {
            match body.frame().await {
                Some(Ok(frame)) => received += frame.data_ref().map_or(0, Bytes::len),
                Some(Err(_)) => return true,
                None => return false,
            }
        }
    })
    .await
    .expect("the body ends");
    assert!(ended, "the body ends with an error, not cleanly");
    assert_eq!(received, CHUNKS[0] + CHUNKS[1]);
    let used = fleet.charge_delivered("e", 0).await.unwrap();
    assert_eq!(used.used, received as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_naming_no_tenant_is_400() {
    let (host, port) = redis("a_request_naming_no_tenant_is_400");
    let quotas = Quotas {
        requests_per_minute: 100,
        bytes_per_hour: 1 << 30,
    };
    let fleet = connect(config(&host, port, "anonymous", quotas)).await;
    let server = Server::start(app(fleet)).await;
    let (status, retry_after, body) = fetch(server.addr, "/hello", &[]).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(retry_after, None);
    assert!(body.contains("names no tenant"), "{body}");
}

/// A TCP forwarder to Redis that the test can shut: its port closes and every connection
/// through it is cut.
struct Proxy {
    port: u16,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
}

impl Proxy {
    async fn start(host: &str, port: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let local = listener.local_addr().unwrap().port();
        let tasks: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let target = format!("{host}:{port}");
        let spawned = tasks.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    return;
                };
                let target = target.clone();
                let task = tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(&target).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                spawned.lock().unwrap().push(task);
            }
        });
        Proxy {
            port: local,
            tasks,
            accept,
        }
    }

    /// Closes the port and cuts every connection.
    async fn shut(self) {
        self.accept.abort();
        let _ = self.accept.await;
        for task in self.tasks.lock().unwrap().drain(..) {
            task.abort();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_unreachable_is_503() {
    let (host, port) = redis("redis_unreachable_is_503");
    let quotas = Quotas {
        requests_per_minute: 100,
        bytes_per_hour: 1 << 30,
    };
    let proxy = Proxy::start(&host, port).await;
    let fleet = connect(config("127.0.0.1", proxy.port, "unreachable", quotas)).await;
    let server = Server::start(app(fleet)).await;
    let (status, _, _) = fetch(server.addr, "/hello", &[("x-tenant", "f")]).await;
    assert_eq!(status, 200, "served while Redis is reachable");

    proxy.shut().await;
    let (status, retry_after, body) =
        tokio::time::timeout(PATIENCE, fetch(server.addr, "/hello", &[("x-tenant", "f")]))
            .await
            .expect("the charge fails within its timeouts");
    assert_eq!(status, 503, "{body}");
    assert_eq!(retry_after.as_deref(), Some("1"));
    assert!(body.contains("failed on the coordinator"), "{body}");
}

/// Deletes `keys` on the server at `host:port`, in RESP written by hand (the tests need no Redis
/// client of their own); the number deleted.
async fn delete(host: &str, port: u16, keys: &[String]) -> u64 {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let mut stream = TcpStream::connect((host, port)).await.unwrap();
    let mut command = format!("*{}\r\n$3\r\nDEL\r\n", keys.len() + 1);
    for key in keys {
        command.push_str(&format!("${}\r\n{key}\r\n", key.len()));
    }
    stream.write_all(command.as_bytes()).await.unwrap();
    let mut reply = [0u8; 64];
    let read = stream.read(&mut reply).await.unwrap();
    let reply = std::str::from_utf8(&reply[..read]).unwrap();
    reply
        .strip_prefix(':')
        .and_then(|n| n.trim_end().parse().ok())
        .unwrap_or_else(|| panic!("DEL answered {reply:?}"))
}

/// The cell's config changed under this instance (another deployment recreated the cell with
/// other quotas): no retry can fix that until the service is redeployed, so the charge is a 500
/// with no `Retry-After`, and over gRPC `INTERNAL` with no pushback, each naming the fingerprint
/// now stored. (The code before issue 37 answered 503 with `Retry-After: 1`, and `UNAVAILABLE`
/// with a pushback of 1,000 ms.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_changed_under_the_instance_is_500_not_503() {
    let (host, port) = redis("a_config_changed_under_the_instance_is_500_not_503");
    let quotas = Quotas {
        requests_per_minute: 100,
        bytes_per_hour: 1 << 30,
    };
    let ours = config(&host, port, "mismatch", quotas);
    let fleet = connect(ours.clone()).await;
    let server = Server::start(app(fleet.clone())).await;
    let grpc_server = Server::start(grpc_app(fleet.clone())).await;
    let (status, _, _) = fetch(server.addr, "/hello", &[("x-tenant", "m")]).await;
    assert_eq!(status, 200, "served while the config is ours");

    // Another deployment finds the cell gone and creates it with its own quotas.
    assert!(delete(&host, port, &fleet.keys()).await > 0);
    let mut theirs = ours.clone();
    theirs.quotas = Some(Quotas {
        requests_per_minute: 7,
        bytes_per_hour: 1 << 30,
    });
    let _theirs = connect(theirs.clone()).await;
    let line = format!(
        "quota refused: admission-redis: the cell's config fingerprint changed to {}",
        theirs.fingerprint()
    );
    let answer = fetch(server.addr, "/hello", &[("x-tenant", "m")]).await;
    assert_eq!(answer, (500, None, format!("{line}\n")));
    let answer = grpc_get(grpc_server.addr, "/hello", &[("x-tenant", "m")]).await;
    let s = |v: &str| Some(v.to_owned());
    assert_eq!(answer, (200, [s("13"), s(&line), None], 0));
}

/// The gRPC answers: within the quota the service's own; past it `RESOURCE_EXHAUSTED` with the
/// milliseconds until the window ends as pushback (the same window the refusal reports); no
/// tenant `INVALID_ARGUMENT`; Redis gone `UNAVAILABLE` with a pushback of 1,000 ms. Each is a
/// trailers-only response: HTTP 200 and no body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_answers_carry_the_status_and_the_pushback() {
    let (host, port) = redis("grpc_answers_carry_the_status_and_the_pushback");
    const N: u64 = 2;
    let quotas = Quotas {
        requests_per_minute: N,
        bytes_per_hour: 1 << 30,
    };
    let proxy = Proxy::start(&host, port).await;
    let fleet = connect(config("127.0.0.1", proxy.port, "grpc", quotas)).await;
    clear_of_window_end(&fleet).await;
    let server = Server::start(grpc_app(fleet.clone())).await;
    for i in 0..N {
        let (status, headers, len) = grpc_get(server.addr, "/hello", &[("x-tenant", "g")]).await;
        assert_eq!(
            (status, &headers, len),
            (200, &[None, None, None], 5),
            "call {i}"
        );
    }
    let (status, [code, message, pushback], len) =
        grpc_get(server.addr, "/hello", &[("x-tenant", "g")]).await;
    assert_eq!((status, code.as_deref(), len), (200, Some("8"), 0));
    let message = message.expect("a grpc-message");
    assert!(
        message.starts_with("quota refused: ")
            && message.contains("requests-per-minute quota exceeded: 2 used + 1 asked > 2"),
        "{message}"
    );
    let pushback: u64 = pushback.expect("a pushback").parse().unwrap();
    let left = match fleet.charge_request("g").await.unwrap_err() {
        admission_redis::QuotaError::Exceeded { retry_after, .. } => retry_after,
        other => panic!("{other:?}"),
    };
    // Asked a moment later: the window's end is the same instant.
    let left = u64::try_from(left.as_millis()).unwrap();
    assert!(
        pushback >= left && pushback <= left + 1_000 && pushback <= 60_000,
        "pushback {pushback} ms, window left {left} ms"
    );

    let (status, [code, message, pushback], len) = grpc_get(server.addr, "/hello", &[]).await;
    assert_eq!(
        (status, code.as_deref(), pushback, len),
        (200, Some("3"), None, 0)
    );
    assert_eq!(
        message.as_deref(),
        Some("quota refused: the request names no tenant")
    );

    proxy.shut().await;
    let (status, [code, message, pushback], len) = tokio::time::timeout(
        PATIENCE,
        grpc_get(server.addr, "/hello", &[("x-tenant", "h")]),
    )
    .await
    .expect("the charge fails within its timeouts");
    assert_eq!(
        (status, code.as_deref(), pushback.as_deref(), len),
        (200, Some("14"), Some("1000"), 0)
    );
    assert!(
        message.unwrap().contains("failed on the coordinator"),
        "names the coordinator"
    );
}

/// A spent byte quota mid-stream ends a gRPC response with trailers saying
/// `RESOURCE_EXHAUSTED`, after the frames that were charged, instead of cutting the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_byte_quota_ends_a_grpc_stream_with_its_status() {
    let (host, port) = redis("a_spent_byte_quota_ends_a_grpc_stream_with_its_status");
    let quotas = Quotas {
        requests_per_minute: 100,
        bytes_per_hour: 1_010,
    };
    let fleet = connect(config(&host, port, "grpc-spent", quotas)).await;
    clear_of_window_end(&fleet).await;
    let server = Server::start(grpc_app(fleet.clone())).await;
    let response = server
        .get("/chunks", &[("x-tenant", "i"), ("te", "trailers")])
        .await;
    assert_eq!(response.status().as_u16(), 200);
    let mut body = response.into_body();
    let mut received = 0;
    let trailers = tokio::time::timeout(PATIENCE, async {
        loop {
            match body.frame().await {
                Some(Ok(frame)) if frame.is_data() => {
                    received += frame.data_ref().map_or(0, Bytes::len);
                }
                Some(Ok(frame)) => return frame.into_trailers().ok(),
                Some(Err(error)) => panic!("the stream failed instead: {error}"),
                None => return None,
            }
        }
    })
    .await
    .expect("the body ends")
    .expect("trailers end the stream");
    assert_eq!(received, CHUNKS[0] + CHUNKS[1]);
    assert_eq!(trailers.get("grpc-status").unwrap(), "8");
    let message = trailers.get("grpc-message").unwrap().to_str().unwrap();
    assert!(
        message.starts_with("quota refused: delivered bytes not charged"),
        "{message}"
    );
    assert!(trailers.get("grpc-retry-pushback-ms").is_some());
    let used = fleet.charge_delivered("i", 0).await.unwrap();
    assert_eq!(used.used, received as u64);
}

#[test]
fn the_layer_service_and_body_are_send_and_sync() {
    fn send_sync<X: Send + Sync>() {}
    type Tenant = fn(&Request) -> Option<String>;
    send_sync::<QuotaLayer<Tenant>>();
    send_sync::<admission_tower::fleet::Quota<Router, Tenant>>();
    // As Sync as the inner body (axum's own `Body` is Send only).
    send_sync::<admission_tower::fleet::QuotaBody<http_body_util::Full<Bytes>>>();
    send_sync::<admission_tower::fleet::QuotaBodyError>();
}
