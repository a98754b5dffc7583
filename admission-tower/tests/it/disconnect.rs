//! A client that hangs up while its request waits leaves the monitor's line.

use std::sync::Arc;

use admission_accounts::CountingGate;
use admission_core::Monitor;
use admission_core::event::RejectReason;
use admission_tower::AdmissionLayer;
use http_body_util::BodyExt;

use crate::{Events, Server, Streams, one_permit_of, routes};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_while_waiting_leaves_the_line() {
    let (sink, mut events) = Events::new();
    let monitor = Monitor::builder().sink(sink).build();
    let gate = Arc::new(CountingGate::new("workers", 1, monitor.clock().clone()).unwrap());
    let streams = Streams::default();
    let layer = AdmissionLayer::new(monitor.clone(), one_permit_of(&gate)).http_responses();
    let server = Server::start(routes(&streams).layer(layer)).await;

    // The one permit is held by a streaming response.
    let body = streams.open();
    let mut holder = server.get("/stream", &[]).await;
    assert_eq!(events.until("granted_immediate").await, None);

    let mut waiting = server.connect().await;
    waiting.send_in_background("/hello");
    assert_eq!(events.until("held").await, None);
    assert_eq!(monitor.queue_size(), 1);

    waiting.hang_up();
    assert_eq!(
        events.until("rejected").await,
        Some(RejectReason::Cancelled)
    );
    assert_eq!(monitor.queue_size(), 0);
    assert_eq!(gate.in_use(), 1, "the holder still streams");

    // The holder ends; the permit is not handed to the client that left.
    drop(body);
    assert!(holder.body_mut().frame().await.is_none());
    assert_eq!(gate.in_use(), 0);
    assert_eq!(monitor.queue_size(), 0);
    monitor.stop();
}
