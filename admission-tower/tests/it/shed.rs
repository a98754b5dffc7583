//! Shedding early: past the layer's [`LineBound`] a request is refused at once, before it
//! waits, with `Retry-After`, and the requests already in the line are served as before; a
//! demand that can never fit is refused as such even then. Under `ExpectedWait` the pace is the
//! line's own (a burst served at once does not count), a stall is read from the waiters' time
//! waited so far, and a waiter the line can no longer serve within the bound is shed before
//! its timeout. Every figure is exact, on a fake clock that only the test moves.

use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::Duration;

use admission_accounts::CountingGate;
use admission_core::Monitor;
use admission_testkit::FakeClock;
use admission_tower::{AdmissionLayer, LineBound};
use http_body_util::BodyExt;

use crate::grpc::{grpc, grpc_get};
use crate::retry::by_path;
use crate::status::{Cases, never_fits, refused};
use crate::{Events, PATIENCE, Server, Streams, fetch, get_at, one_permit_of, routes};

const TIMEOUT: Duration = Duration::from_secs(5);

/// The headers of a request of [`Cases`] that fits, one asking two permits of the one, and one
/// asking 5,000 bytes of the 1,000.
const OK: &[(&str, &str)] = &[("x-demand", "ok")];
const TOO_MANY: &[(&str, &str)] = &[("x-demand", "too-many")];
const TOO_BIG: &[(&str, &str)] = &[("x-demand", "bytes"), ("x-bytes", "5000")];

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

/// A demand that can never fit is refused as such past the bound too, before any shedding:
/// with the only permit held and one request waiting (the bound: one waiter), a burst of eight
/// requests asking two permits of the one-permit gate are all 422 with the numbers, eight asking
/// 5,000 bytes of a 1,000-byte account all 413, and over gRPC `INVALID_ARGUMENT`, none with a
/// retry time. (The code before issue 37 looked at the bound first and answered all of them
/// `503 shed` with `Retry-After: 1`.) A request that fits is still shed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demand_that_can_never_fit_is_refused_as_such_past_the_bound() {
    for grpc_answers in [false, true] {
        let clock = FakeClock::new();
        let (sink, mut events) = Events::new();
        let monitor = Monitor::builder().clock(clock.shared()).sink(sink).build();
        let cases = Cases::new(&monitor);
        let layer = cases
            .layer(&monitor)
            .timeout(TIMEOUT)
            .shed(LineBound::Waiters(NonZeroU64::new(1).unwrap()));
        let router = if grpc_answers {
            routes(&Streams::default()).layer(layer.grpc_responses())
        } else {
            routes(&Streams::default()).layer(layer.http_responses())
        };
        let server = Server::start(router).await;
        let addr = server.addr;
        let holder = cases.hold_workers(&monitor);
        let waiting = tokio::spawn(fetch(addr, "/hello", OK));
        assert_eq!(events.until("held").await, None);
        let burst: Vec<_> = (0..8)
            .flat_map(|_| {
                [
                    tokio::spawn(answer(addr, TOO_MANY, grpc_answers)),
                    tokio::spawn(answer(addr, TOO_BIG, grpc_answers)),
                ]
            })
            .collect();
        let mut answers = Vec::new();
        for call in burst {
            answers.push(tokio::time::timeout(PATIENCE, call).await.unwrap().unwrap());
        }
        let (never, never_bytes, shed) = if grpc_answers {
            let message = |reason, gate: &str, asked, capacity| {
                never_fits(reason, gate, asked, capacity)
                    .trim_start_matches("admission refused: ")
                    .trim_end()
                    .to_owned()
            };
            (
                Said::Grpc(grpc("3", &message("too_large", "workers", 2, 1), None)),
                Said::Grpc(grpc(
                    "3",
                    &message("too_large_bytes", "upload-bytes", 5000, 1000),
                    None,
                )),
                Said::Grpc(grpc("14", "shed", Some("1000"))),
            )
        } else {
            (
                Said::Http((422, None, never_fits("too_large", "workers", 2, 1))),
                Said::Http((
                    413,
                    None,
                    never_fits("too_large_bytes", "upload-bytes", 5000, 1000),
                )),
                Said::Http((503, Some("1".to_owned()), refused("shed"))),
            )
        };
        let expected: Vec<Said> = (0..8)
            .flat_map(|_| [never.clone(), never_bytes.clone()])
            .collect();
        assert_eq!(answers, expected, "grpc: {grpc_answers}");
        assert_eq!(answer(addr, OK, grpc_answers).await, shed);
        assert_eq!(monitor.queue_size(), 1);
        drop(holder);
        let served = tokio::time::timeout(PATIENCE, waiting)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(served.0, 200);
        monitor.stop();
    }
}

/// What a client was answered, over HTTP or gRPC.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Said {
    Http((u16, Option<String>, String)),
    Grpc((u16, [Option<String>; 3], usize)),
}

/// `GET /hello` with `headers`: the HTTP answer, or the gRPC one.
async fn answer(addr: std::net::SocketAddr, headers: &[(&str, &str)], grpc_answers: bool) -> Said {
    if grpc_answers {
        Said::Grpc(grpc_get(addr, "/hello", headers).await)
    } else {
        Said::Http(fetch(addr, "/hello", headers).await)
    }
}

/// A line of at most 5 s, its requests timing out after 10 s, in front of a backend that
/// completes nothing (the only permit is held by a stream that never ends) from the start, so
/// the layer has no pace at all: the waiters' time waited so far is all it reads. At 0 s the
/// first request waits (it expects nothing). At 1 s the line has gone 1 s without a grant: the
/// second expects 2 × 1 s and waits. At 2 s the third expects 3 × 2 s = 6 s and is refused at
/// once, `Retry-After: 6`. At 2.5 s the fourth expects 7.5 s (`Retry-After: 8`), and its arrival
/// sheds the second, which has waited 1.5 s and expects 2 × 2.5 s more, 6.5 s in all
/// (`Retry-After: 5`, its own expected wait); the head (2.5 s waited, 2.5 s expected) stays.
/// Nothing waits for the 10 s timeout. (The code before issue 37 shed nothing while nothing
/// completed: the third request waited, and no answer came without the clock moving.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_backend_is_shed_from_the_waiters_time_waited_so_far() {
    let clock = FakeClock::new();
    let (sink, mut events) = Events::new();
    let monitor = Monitor::builder().clock(clock.shared()).sink(sink).build();
    let gate = Arc::new(CountingGate::new("workers", 1, monitor.clock().clone()).unwrap());
    let streams = Streams::default();
    let layer = AdmissionLayer::new(monitor.clone(), one_permit_of(&gate))
        .timeout(Duration::from_secs(10))
        .shed(LineBound::ExpectedWait(TIMEOUT))
        .http_responses();
    let server = Server::start(routes(&streams).layer(layer)).await;
    let addr = server.addr;
    // The stall: the permit's holder never finishes (its stream stays open).
    let body = streams.open();
    let holder = server.get("/stream", &[]).await;
    assert_eq!(holder.status(), 200);
    let head = tokio::spawn(fetch(addr, "/waited", &[]));
    assert_eq!(events.until("held").await, None);
    clock.advance(Duration::from_secs(1));
    let second = tokio::spawn(fetch(addr, "/waited", &[]));
    assert_eq!(events.until("held").await, None);
    clock.advance(Duration::from_secs(1));
    let third = tokio::time::timeout(PATIENCE, fetch(addr, "/waited", &[]))
        .await
        .expect("answered without the clock moving");
    assert_eq!(third, (503, Some("6".to_owned()), refused("shed")));
    assert_eq!(monitor.queue_size(), 2);
    clock.advance(Duration::from_millis(500));
    let fourth = tokio::time::timeout(PATIENCE, fetch(addr, "/waited", &[]))
        .await
        .expect("answered without the clock moving");
    assert_eq!(fourth, (503, Some("8".to_owned()), refused("shed")));
    let second = tokio::time::timeout(PATIENCE, second)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(second, (503, Some("5".to_owned()), refused("shed")));
    assert_eq!(monitor.queue_size(), 1);
    // The stall ends: the head is served.
    drop(body);
    drop(holder);
    let head = tokio::time::timeout(PATIENCE, head).await.unwrap().unwrap();
    assert_eq!((head.0, head.2.as_str()), (200, "2500"));
    assert_eq!(gate.in_use(), 0);
    monitor.stop();
}

/// Six requests join a line whose pace is unknown at 0 s (nothing has been served yet, the
/// only permit is held); the backend then serves nobody for a second. The next arrival, at 1 s,
/// expects 7 × 1 s and is refused, and its arrival looks at the line from the back against the
/// bound of 4.5 s: the sixth has waited 1 s and expects 6 s more, the fifth 1 + 5 s, the fourth
/// 1 + 4 s, all past it, and are shed at once (`Retry-After` their own expected wait: 6, 5, 4),
/// long before their 5 s timeout; the third (1 + 3 s) and those ahead stay and are served.
/// (The code before issue 37 shed nothing while nothing completed: all six waited, and the
/// seventh too.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_the_line_can_no_longer_serve_in_time_is_shed_before_its_timeout() {
    let clock = FakeClock::new();
    let (sink, mut events) = Events::new();
    let monitor = Monitor::builder().clock(clock.shared()).sink(sink).build();
    let gate = Arc::new(CountingGate::new("workers", 1, monitor.clock().clone()).unwrap());
    let streams = Streams::default();
    let layer = AdmissionLayer::new(monitor.clone(), one_permit_of(&gate))
        .timeout(TIMEOUT)
        .shed(LineBound::ExpectedWait(Duration::from_millis(4_500)))
        .http_responses();
    let server = Server::start(routes(&streams).layer(layer)).await;
    let addr = server.addr;
    let body = streams.open();
    let holder = server.get("/stream", &[]).await;
    assert_eq!(holder.status(), 200);
    let mut waiting = Vec::new();
    for _ in 0..6 {
        waiting.push(tokio::spawn(fetch(addr, "/waited", &[])));
        assert_eq!(events.until("held").await, None);
    }
    clock.advance(Duration::from_secs(1));
    let seventh = tokio::time::timeout(PATIENCE, fetch(addr, "/waited", &[]))
        .await
        .expect("answered without the clock moving");
    assert_eq!(seventh, (503, Some("7".to_owned()), refused("shed")));
    let back = waiting.split_off(3);
    for (client, retry_after) in back.into_iter().zip(["4", "5", "6"]) {
        let answer = tokio::time::timeout(PATIENCE, client)
            .await
            .expect("shed without the clock moving")
            .unwrap();
        assert_eq!(answer, (503, Some(retry_after.to_owned()), refused("shed")));
    }
    assert_eq!(monitor.queue_size(), 3);
    drop(body);
    drop(holder);
    for client in waiting {
        let answer = tokio::time::timeout(PATIENCE, client)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((answer.0, answer.2.as_str()), (200, "1000"));
    }
    assert_eq!(gate.in_use(), 0);
    monitor.stop();
}

/// The pace is the line's own, not a window of completions: forty requests served at once at
/// 0 s (a bucket's stock, say) are no measure of it. One request then waits 1 s for the only
/// permit: the line's interval is 1 s. Behind the request now holding the permit, four more
/// join at 1 s (expecting 1, 2, 3 and 4 s, within the bound of 4.5 s) and a fifth, expecting
/// 5 s, is refused (`Retry-After: 5`); 600 ms into the interval a fifth expects 5 − 0.6 = 4.4 s
/// and joins. (The code before issue 37 counted the forty in its 10 s window, took the line for
/// one that drains 41 requests a second, and let the first fifth wait.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_served_at_once_does_not_make_a_slow_line_look_fast() {
    let clock = FakeClock::new();
    let (sink, mut events) = Events::new();
    let monitor = Monitor::builder().clock(clock.shared()).sink(sink).build();
    let fast = Arc::new(CountingGate::new("fast", 1_000, monitor.clock().clone()).unwrap());
    let workers = Arc::new(CountingGate::new("workers", 1, monitor.clock().clone()).unwrap());
    let streams = Streams::default();
    let layer = AdmissionLayer::new(monitor.clone(), by_path(&fast, &workers))
        .timeout(TIMEOUT)
        .shed(LineBound::ExpectedWait(Duration::from_millis(4_500)))
        .http_responses();
    let server = Server::start(routes(&streams).layer(layer)).await;
    let addr = server.addr;
    for _ in 0..40 {
        assert_eq!(fetch(addr, "/hello", &[]).await.0, 200);
    }
    let first = streams.open();
    let mut holder = server.get("/stream", &[]).await;
    assert_eq!(holder.status(), 200);
    let second = streams.open();
    let next = tokio::spawn(get_at(addr, "/stream", &[]));
    assert_eq!(events.until("held").await, None);
    clock.advance(Duration::from_secs(1));
    drop(first);
    assert!(holder.body_mut().frame().await.is_none());
    let mut next = tokio::time::timeout(PATIENCE, next).await.unwrap().unwrap();
    assert_eq!(next.status(), 200);
    let mut waiting = Vec::new();
    for _ in 0..4 {
        waiting.push(tokio::spawn(fetch(addr, "/waited", &[])));
        assert_eq!(events.until("held").await, None);
    }
    let shed = tokio::time::timeout(PATIENCE, fetch(addr, "/waited", &[]))
        .await
        .expect("answered without the clock moving");
    assert_eq!(shed, (503, Some("5".to_owned()), refused("shed")));
    clock.advance(Duration::from_millis(600));
    waiting.push(tokio::spawn(fetch(addr, "/waited", &[])));
    assert_eq!(events.until("held").await, None);
    assert_eq!(monitor.queue_size(), 5);
    drop(second);
    assert!(next.body_mut().frame().await.is_none());
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
