//! Shedding early: past the layer's [`LineBound`] a request is refused at once, before it
//! waits, with `Retry-After`, and the requests already in the line are served as before.

use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::Duration;

use admission_accounts::CountingGate;
use admission_core::{Instant, Monitor};
use admission_testkit::FakeClock;
use admission_tower::{AdmissionLayer, LineBound};
use http_body_util::BodyExt;

use crate::grpc::{grpc, grpc_get};
use crate::retry::by_path;
use crate::status::refused;
use crate::{Events, PATIENCE, Server, Streams, fetch, one_permit_of, routes};

const TIMEOUT: Duration = Duration::from_secs(5);

/// At most three waiting: with the only permit held and three requests in the line, the fourth
/// and fifth are answered 503 `shed` at once (the fake clock never moves, so a refusal after the
/// timeout could not come), with the estimate's floor of 1 s (nothing has completed yet); over
/// gRPC, `UNAVAILABLE` with a pushback of 1,000 ms. The three then get the permit in turn, and
/// with the line empty a new request is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_a_bound_on_waiters_a_request_is_refused_at_once() {
    for grpc_answers in [false, true] {
        let clock = FakeClock::new();
        let (sink, mut events) = Events::new();
        let monitor = Monitor::builder().clock(clock.shared()).sink(sink).build();
        let gate = Arc::new(CountingGate::new("workers", 1, monitor.clock().clone()).unwrap());
        let streams = Streams::default();
        let layer = AdmissionLayer::new(monitor.clone(), one_permit_of(&gate))
            .timeout(TIMEOUT)
            .shed(LineBound::Waiters(NonZeroU64::new(3).unwrap()));
        let router = if grpc_answers {
            routes(&streams).layer(layer.grpc_responses())
        } else {
            routes(&streams).layer(layer.http_responses())
        };
        let server = Server::start(router).await;
        let body = streams.open();
        let mut holder = server.get("/stream", &[]).await;
        assert_eq!(holder.status(), 200);
        let addr = server.addr;
        let waiting: Vec<_> = (0..3)
            .map(|_| tokio::spawn(fetch(addr, "/hello", &[])))
            .collect();
        for _ in 0..3 {
            assert_eq!(events.until("held").await, None);
        }
        for _ in 0..2 {
            if grpc_answers {
                let answer = tokio::time::timeout(PATIENCE, grpc_get(addr, "/hello", &[]))
                    .await
                    .expect("answered without the clock moving");
                assert_eq!(answer, grpc("14", "shed", Some("1000")));
            } else {
                let answer = tokio::time::timeout(PATIENCE, fetch(addr, "/hello", &[]))
                    .await
                    .expect("answered without the clock moving");
                assert_eq!(answer, (503, Some("1".to_owned()), refused("shed")));
            }
        }
        assert_eq!(monitor.queue_size(), 3);
        drop(body);
        assert!(holder.body_mut().frame().await.is_none());
        for client in waiting {
            let answer = tokio::time::timeout(PATIENCE, client)
                .await
                .unwrap()
                .unwrap();
            assert_eq!((answer.0, answer.2.as_str()), (200, "hello"));
        }
        let after = fetch(addr, "/hello", &[]).await;
        assert_eq!((after.0, after.2.as_str()), (200, "hello"));
        assert_eq!(gate.in_use(), 0);
        monitor.stop();
    }
}

/// A line of at most 2 s at the measured pace. `/hello` completes twice a second of the fake
/// clock from 0.5 s to 10 s; at 10.05 s the default 10 s window counts the 19 completions from
/// 1 s on over a span of 9.05 s, so `w` waiting requests take `w × 9.05 / 19` s: 0 for the first
/// arrival behind the held permit, 1.905 s for the fifth (not over 2 s: it waits too), 2.382 s
/// for the sixth, which is refused at once with `Retry-After: 3` (the same 2.382 s, rounded up).
/// A bound of 3 s lets the sixth and seventh wait (2.382 s and 2.858 s) and sheds the eighth.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_a_bound_on_the_expected_wait_a_request_is_refused_at_once() {
    for (bound, waits, retry_after) in [(2, 5, "3"), (3, 7, "4")] {
        let clock = FakeClock::new();
        let (sink, mut events) = Events::new();
        let monitor = Monitor::builder().clock(clock.shared()).sink(sink).build();
        let fast = Arc::new(CountingGate::new("fast", 1_000, monitor.clock().clone()).unwrap());
        let workers = Arc::new(CountingGate::new("workers", 1, monitor.clock().clone()).unwrap());
        let streams = Streams::default();
        let layer = AdmissionLayer::new(monitor.clone(), by_path(&fast, &workers))
            .timeout(TIMEOUT)
            .shed(LineBound::ExpectedWait(Duration::from_secs(bound)))
            .http_responses();
        let server = Server::start(routes(&streams).layer(layer)).await;
        let addr = server.addr;
        for half_seconds in 1..=20 {
            clock.advance_to(Instant::from_nanos(half_seconds * 500_000_000));
            assert_eq!(fetch(addr, "/hello", &[]).await.0, 200);
        }
        clock.advance_to(Instant::from_nanos(10_050_000_000));
        let body = streams.open();
        let mut holder = server.get("/stream", &[]).await;
        assert_eq!(holder.status(), 200);
        let mut waiting = Vec::new();
        for _ in 0..waits {
            waiting.push(tokio::spawn(fetch(addr, "/waited", &[])));
            assert_eq!(events.until("held").await, None);
        }
        let shed = tokio::time::timeout(PATIENCE, fetch(addr, "/waited", &[]))
            .await
            .expect("answered without the clock moving");
        assert_eq!(
            shed,
            (503, Some(retry_after.to_owned()), refused("shed")),
            "bound {bound} s"
        );
        assert_eq!(monitor.queue_size(), waits);
        // The line drains as before: each waiter in turn, the next once the last one's body
        // ended.
        drop(body);
        assert!(holder.body_mut().frame().await.is_none());
        for client in waiting {
            let answer = tokio::time::timeout(PATIENCE, client)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(answer.0, 200);
        }
        assert_eq!((fast.in_use(), workers.in_use()), (0, 0));
        monitor.stop();
    }
}
