//! A streamed body keeps the request's permits until it ends, fails or is dropped.

use std::sync::Arc;

use admission_accounts::CountingGate;
use admission_core::Monitor;
use admission_tower::AdmissionLayer;
use bytes::Bytes;
use http_body_util::BodyExt;

use crate::{Events, Server, Streams, one_permit_of, routes};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_body_keeps_its_permits_until_it_ends() {
    let monitor = Monitor::new();
    let gate = Arc::new(CountingGate::new("workers", 2, monitor.clock().clone()).unwrap());
    let streams = Streams::default();
    let layer = AdmissionLayer::new(monitor.clone(), one_permit_of(&gate)).http_responses();
    let server = Server::start(routes(&streams).layer(layer)).await;

    let body = streams.open();
    let mut response = server.get("/stream", &[]).await;
    assert_eq!(response.status(), 200);
    assert_eq!(gate.in_use(), 1, "the head is out, the body is not");
    for chunk in ["first", "second"] {
        body.send(Ok(Bytes::from(chunk))).unwrap();
        let frame = response.body_mut().frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), chunk);
        assert_eq!(gate.in_use(), 1, "still streaming after `{chunk}`");
    }
    drop(body);
    assert!(response.body_mut().frame().await.is_none());
    assert_eq!(gate.in_use(), 0, "released as the body ended");
    monitor.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_fails_gives_its_permits_back() {
    let monitor = Monitor::new();
    let gate = Arc::new(CountingGate::new("workers", 2, monitor.clock().clone()).unwrap());
    let streams = Streams::default();
    let layer = AdmissionLayer::new(monitor.clone(), one_permit_of(&gate)).http_responses();
    let server = Server::start(routes(&streams).layer(layer)).await;

    let body = streams.open();
    let mut response = server.get("/stream", &[]).await;
    body.send(Ok(Bytes::from("part"))).unwrap();
    let frame = response.body_mut().frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), "part");
    assert_eq!(gate.in_use(), 1);
    body.send(Err(std::io::Error::other("the upstream broke")))
        .unwrap();
    // The server aborts the response: the client sees the body fail, after the release.
    assert!(matches!(response.body_mut().frame().await, Some(Err(_))));
    assert_eq!(gate.in_use(), 0);
    monitor.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_mid_stream_gives_its_permits_back() {
    let (sink, mut events) = Events::new();
    let monitor = Monitor::builder().sink(sink).build();
    let gate = Arc::new(CountingGate::new("workers", 2, monitor.clock().clone()).unwrap());
    let streams = Streams::default();
    let layer = AdmissionLayer::new(monitor.clone(), one_permit_of(&gate)).http_responses();
    let server = Server::start(routes(&streams).layer(layer)).await;

    let body = streams.open();
    let mut client = server.connect().await;
    let mut response = client.get("/stream", &[]).await;
    body.send(Ok(Bytes::from("part"))).unwrap();
    let frame = response.body_mut().frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), "part");
    assert_eq!(gate.in_use(), 1);

    drop(response);
    client.hang_up();
    // The server drops the response body when it sees the connection close.
    assert_eq!(events.until("released").await, None);
    assert_eq!(gate.in_use(), 0);
    monitor.stop();
}
