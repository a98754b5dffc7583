//! Every 503 carries a `Retry-After` (every `UNAVAILABLE` a `grpc-retry-pushback-ms`): the
//! refuser's own time, or the layer's estimate from the drain it measured, on the monitor's
//! fake clock.

use std::sync::Arc;
use std::time::Duration;

use admission_accounts::CountingGate;
use admission_core::{Amount, Demand, Instant, JobContext, Monitor};
use admission_testkit::FakeClock;
use admission_tower::{AdmissionLayer, DemandError, RetryEstimate};
use axum::extract::Request;
use http_body_util::BodyExt;

use crate::grpc::{grpc, grpc_get};
use crate::status::refused;
use crate::{Events, PATIENCE, Server, Streams, fetch, one_permit_of, routes};

const TIMEOUT: Duration = Duration::from_secs(5);

/// What a client was answered: an HTTP refusal ([`fetch`]) or a gRPC status ([`grpc_get`]).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Answer {
    Http(u16, Option<String>, String),
    Grpc(u16, [Option<String>; 3], usize),
}

impl Answer {
    /// A 503 `timed_out` with `Retry-After: secs`.
    fn timed_out(secs: &str) -> Answer {
        Answer::Http(503, Some(secs.to_owned()), refused("timed_out"))
    }

    /// The retry time it carries, in whole seconds, when it is a positive integer.
    fn retry_secs(&self) -> Option<u64> {
        let secs = match self {
            Answer::Http(_, retry_after, _) => retry_after.as_deref()?.parse().ok()?,
            Answer::Grpc(_, [.., pushback], _) => {
                let millis: u64 = pushback.as_deref()?.parse().ok()?;
                millis.is_multiple_of(1_000).then_some(millis / 1_000)?
            }
        };
        (secs > 0).then_some(secs)
    }
}

/// `clients` requests wait behind a holder of the only permit until the layer's timeout: what
/// each of them is answered, over HTTP or as gRPC statuses.
async fn all_time_out(clients: usize, estimate: Option<RetryEstimate>, grpc: bool) -> Vec<Answer> {
    let clock = FakeClock::new();
    let (sink, mut events) = Events::new();
    let monitor = Monitor::builder().clock(clock.shared()).sink(sink).build();
    let gate = Arc::new(CountingGate::new("workers", 1, monitor.clock().clone()).unwrap());
    let streams = Streams::default();
    let mut layer = AdmissionLayer::new(monitor.clone(), one_permit_of(&gate)).timeout(TIMEOUT);
    if let Some(estimate) = estimate {
        layer = layer.retry_estimate(estimate);
    }
    let router = if grpc {
        routes(&streams).layer(layer.grpc_responses())
    } else {
        routes(&streams).layer(layer.http_responses())
    };
    let server = Server::start(router).await;

    let body = streams.open();
    let mut holder = server.get("/stream", &[]).await;
    let addr = server.addr;
    let waiting: Vec<_> = (0..clients)
        .map(|_| {
            tokio::spawn(async move {
                if grpc {
                    let (status, headers, len) = grpc_get(addr, "/hello", &[]).await;
                    Answer::Grpc(status, headers, len)
                } else {
                    let (status, retry_after, text) = fetch(addr, "/hello", &[]).await;
                    Answer::Http(status, retry_after, text)
                }
            })
        })
        .collect();
    for _ in 0..clients {
        assert_eq!(events.until("held").await, None);
    }
    assert_eq!(monitor.queue_size(), clients);
    clock.advance(TIMEOUT);
    let mut answers = Vec::with_capacity(clients);
    for client in waiting {
        answers.push(
            tokio::time::timeout(PATIENCE, client)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    assert_eq!(monitor.queue_size(), 0);
    drop(body);
    assert!(holder.body_mut().frame().await.is_none());
    assert_eq!(gate.in_use(), 0);
    monitor.stop();
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_503_under_load_carries_a_retry_after_of_whole_seconds() {
    for clients in [64, 256] {
        let answers = all_time_out(clients, None, false).await;
        assert!(
            answers.iter().all(|a| a.retry_secs().is_some()),
            "{answers:?}"
        );
        // Nothing completed while they waited: each estimate is the 5 s its request waited.
        assert_eq!(
            answers,
            vec![Answer::timed_out("5"); clients],
            "{clients} clients"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_estimate_keeps_to_the_configured_floor_and_ceiling() {
    let ceiling = RetryEstimate::new().ceiling(Duration::from_secs(2));
    let answers = all_time_out(64, Some(ceiling), false).await;
    assert_eq!(answers, vec![Answer::timed_out("2"); 64]);
    let floor = RetryEstimate::new().floor(Duration::from_secs(30));
    let answers = all_time_out(8, Some(floor), false).await;
    assert_eq!(answers, vec![Answer::timed_out("30"); 8]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_unavailable_grpc_status_carries_a_retry_pushback() {
    let answers = all_time_out(64, None, true).await;
    assert!(
        answers.iter().all(|a| a.retry_secs().is_some()),
        "{answers:?}"
    );
    let (status, headers, len) = grpc("14", "timed_out", Some("5000"));
    assert_eq!(answers, vec![Answer::Grpc(status, headers, len); 64]);
}

/// Requests on `/hello` take one of many permits and complete at once; every other path waits
/// for the single `workers` permit.
pub(crate) fn by_path(
    fast: &Arc<CountingGate>,
    workers: &Arc<CountingGate>,
) -> impl Fn(&Request) -> Result<(Demand, JobContext), DemandError> + Clone + Send + Sync + 'static
{
    let (fast, workers) = (fast.clone(), workers.clone());
    move |request: &Request| {
        let gate = match request.uri().path() {
            "/hello" => fast.clone(),
            _ => workers.clone(),
        };
        let ctx = JobContext::new(request.uri().path().to_owned());
        Ok((Demand::new().with(gate, Amount::ONE), ctx))
    }
}

/// The layer completes `/hello` requests at a steady 2 a second of the fake clock while twelve
/// requests wait behind a held permit and time out one by one, 100 ms apart. Each is told to
/// retry after about the time the waiters still in line take to drain at the measured rate:
/// `w / 2` seconds for `w` waiting (itself included). The counted span `s` is 9 to 10 s of the
/// default 10 s window, holding `2s ± 1` completions (one off at either edge), so the estimate
/// is `w/2 × 2s/(2s ± 1)` rounded up: `w/2 × 18/19 ≤ estimate ≤ w/2 × 18/17 + 1`, and at least
/// 1. The exact values follow from the formula, and are checked too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_estimate_follows_the_drain_the_layer_measured() {
    const WAITERS: u64 = 12;
    const PER_SECOND: f64 = 2.0;
    let clock = FakeClock::new();
    let (sink, mut events) = Events::new();
    let monitor = Monitor::builder().clock(clock.shared()).sink(sink).build();
    let fast = Arc::new(CountingGate::new("fast", 1_000, monitor.clock().clone()).unwrap());
    let workers = Arc::new(CountingGate::new("workers", 1, monitor.clock().clone()).unwrap());
    let streams = Streams::default();
    let layer = AdmissionLayer::new(monitor.clone(), by_path(&fast, &workers))
        .timeout(TIMEOUT)
        .http_responses();
    let server = Server::start(routes(&streams).layer(layer)).await;

    let body = streams.open();
    let mut holder = server.get("/stream", &[]).await;
    assert_eq!(holder.status(), 200);
    let arrives = |j: u64| 10_050 + 100 * j;
    let mut waiting = Vec::new();
    let mut estimates = Vec::new();
    for millis in (0..=16_500).step_by(50) {
        clock.advance_to(Instant::from_nanos(millis * 1_000_000));
        if millis.is_multiple_of(500) {
            // A completion of the steady drain.
            assert_eq!(
                fetch(server.addr, "/hello", &[]).await.0,
                200,
                "at {millis} ms"
            );
        }
        if let Some(j) = (0..WAITERS).find(|&j| arrives(j) == millis) {
            waiting.push(tokio::spawn(fetch(server.addr, "/waited", &[])));
            assert_eq!(events.until("held").await, None, "waiter {j}");
        }
        if let Some(j) = (0..WAITERS).find(|&j| arrives(j) + 5_000 == millis) {
            let client = waiting.remove(0);
            let (status, retry_after, text) = tokio::time::timeout(PATIENCE, client)
                .await
                .unwrap()
                .unwrap();
            assert_eq!((status, text), (503, refused("timed_out")), "waiter {j}");
            let secs: u64 = retry_after.expect("a Retry-After").parse().unwrap();
            let w = (WAITERS - j) as f64;
            let drains_in = w / PER_SECOND;
            let (low, high) = (drains_in * 18.0 / 19.0, drains_in * 18.0 / 17.0 + 1.0);
            assert!(
                secs >= 1 && (low..=high.max(1.0)).contains(&(secs as f64)),
                "waiter {j}: {w} waiting at {PER_SECOND}/s drain in {drains_in} s, told {secs} s"
            );
            estimates.push(secs);
        }
    }
    // `w × span / completions`, rounded up. The span runs from 6 s to the refusal (9.05 s for
    // the first, 0.1 s more for each next), then from 7 s once the clock passes 16 s; it holds
    // the completions from its start up to the refusal: 19 before 15.5 s, 20 after, then 19.
    assert_eq!(estimates, [6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1]);
    drop(body);
    assert!(holder.body_mut().frame().await.is_none());
    assert_eq!((fast.in_use(), workers.in_use()), (0, 0));
    monitor.stop();
}
