//! Concurrent clients through a real server never hold more than the capacity.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use admission_accounts::CountingGate;
use admission_core::Monitor;
use admission_tower::AdmissionLayer;
use axum::Router;
use axum::routing::get;
use tokio::sync::Barrier;

use crate::{Server, fetch, one_permit_of};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_never_hold_more_than_the_capacity() {
    const CAPACITY: u64 = 3;
    const CLIENTS: usize = 12;
    let monitor = Monitor::new();
    let gate = Arc::new(CountingGate::new("workers", CAPACITY, monitor.clock().clone()).unwrap());
    // Each handler waits until CAPACITY handlers are in at once, so the peak is reached, and
    // records the permits in use then.
    let barrier = Arc::new(Barrier::new(CAPACITY as usize));
    let peak = Arc::new(AtomicU64::new(0));
    let handler = {
        let (gate, barrier, peak) = (gate.clone(), barrier.clone(), peak.clone());
        move || {
            let (gate, barrier, peak) = (gate.clone(), barrier.clone(), peak.clone());
            async move {
                peak.fetch_max(gate.in_use(), Ordering::SeqCst);
                barrier.wait().await;
                peak.fetch_max(gate.in_use(), Ordering::SeqCst);
                "done"
            }
        }
    };
    let layer = AdmissionLayer::new(monitor.clone(), one_permit_of(&gate)).http_responses();
    let server = Server::start(Router::new().route("/work", get(handler)).layer(layer)).await;

    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| tokio::spawn(fetch(server.addr, "/work", &[])))
        .collect();
    let mut answers = Vec::new();
    for client in clients {
        answers.push(client.await.unwrap());
    }
    let expected = vec![(200, None, "done".to_owned()); CLIENTS];
    assert_eq!(answers, expected);
    assert_eq!(peak.load(Ordering::SeqCst), CAPACITY);
    assert_eq!(gate.in_use(), 0);
    assert_eq!(monitor.queue_size(), 0);
    monitor.stop();
}
