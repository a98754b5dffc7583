//! Refusals become gRPC statuses in a trailers-only response (feature `grpc`).

use admission_core::Monitor;
use admission_testkit::FakeClock;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::status::Cases;
use crate::{Streams, routes};

/// `GET /hello` with `x-demand: case`: the HTTP status, `grpc-status`, `grpc-message`,
/// `grpc-retry-pushback-ms` and the body's length.
async fn grpc_call(addr: std::net::SocketAddr, case: &str) -> (u16, [Option<String>; 3], usize) {
    grpc_get(addr, "/hello", &[("x-demand", case)]).await
}

/// `GET path` with `headers` on a new connection: what [`grpc_call`] returns.
pub async fn grpc_get(
    addr: std::net::SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, [Option<String>; 3], usize) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let task = tokio::spawn(conn);
    let mut request = hyper::Request::get(path).header("host", "localhost");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(Empty::<Bytes>::new()).unwrap();
    let response = send.send_request(request).await.unwrap();
    let headers = ["grpc-status", "grpc-message", "grpc-retry-pushback-ms"]
        .map(|name| crate::header(&response, name));
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    task.abort();
    (status, headers, body.len())
}

pub fn grpc(
    code: &str,
    message: &str,
    pushback: Option<&str>,
) -> (u16, [Option<String>; 3], usize) {
    let s = |v: &str| Some(v.to_owned());
    (200, [s(code), s(message), pushback.and_then(s)], 0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_is_resource_exhausted_and_an_outage_unavailable() {
    // A clock that stands still: the estimate after the stop below is exactly the floor.
    let clock = FakeClock::new();
    let monitor = Monitor::builder().clock(clock.shared()).build();
    let cases = Cases::new(&monitor);
    let layer = cases.layer(&monitor).grpc_responses();
    let server = crate::Server::start(routes(&Streams::default()).layer(layer)).await;

    let quota = grpc("8", "quota", Some("2000"));
    assert_eq!(grpc_call(server.addr, "quota").await, quota);
    let spent = grpc("8", "quota", Some("90000"));
    assert_eq!(grpc_call(server.addr, "spent").await, spent);
    let circuit = grpc("14", "circuit_open", Some("2500"));
    assert_eq!(grpc_call(server.addr, "circuit").await, circuit);
    // Never retried: INVALID_ARGUMENT, the numbers in the message, no pushback.
    let message = "too_large: account `workers` asked 2, capacity 1: `workers` has 1 permits \
                   in all; a demand of 2 can never fit (ask for at most 1)";
    let too_many = grpc("3", message, None);
    assert_eq!(grpc_call(server.addr, "too-many").await, too_many);
    // On a quota account too: never `RESOURCE_EXHAUSTED`, which clients retry.
    let message = "too_large: account `tenant-big` asked 5, capacity 2: asks 5, more than the 2 \
                   it can ever grant at once";
    let quota_too_large = grpc("3", message, None);
    assert_eq!(
        grpc_call(server.addr, "quota-too-large").await,
        quota_too_large
    );
    let headers = [("x-demand", "bytes"), ("x-bytes", "5000")];
    let message = "too_large_bytes: account `upload-bytes` asked 5000, capacity 1000: \
                   `upload-bytes` has 1000 permits in all; a demand of 5000 can never fit (ask \
                   for at most 1000)";
    let too_big = grpc("3", message, None);
    assert_eq!(grpc_get(server.addr, "/hello", &headers).await, too_big);
    let invalid = grpc("3", "invalid", None);
    assert_eq!(grpc_call(server.addr, "nonsense").await, invalid);
    let unmet = grpc("13", "misconfigured", None);
    assert_eq!(grpc_call(server.addr, "unmet").await, unmet);
    // Admitted: the inner service's own answer.
    let ok = grpc_call(server.addr, "ok").await;
    assert_eq!(ok, (200, [None, None, None], 5));

    monitor.stop();
    let shut = grpc("14", "unavailable", Some("1000"));
    assert_eq!(grpc_call(server.addr, "ok").await, shut);
}
