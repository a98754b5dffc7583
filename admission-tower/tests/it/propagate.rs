//! Without a response mapping, refusals and the inner service's errors come out as
//! `AdmissionError`, and the inner service is called only once admitted.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use admission_accounts::CountingGate;
use admission_core::{Amount, Demand, JobContext, Monitor, Refusal};
use admission_tower::{
    AdmissionError, AdmissionLayer, DemandError, Reason, RetryAfter, RetryEstimate,
};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use tower::{Layer, ServiceExt};

use crate::Refusing;

type Req = http::Request<()>;

/// An inner service that counts its calls and fails on `/fail`.
fn inner(
    calls: &Arc<AtomicUsize>,
) -> impl tower::Service<
    Req,
    Response = http::Response<Full<Bytes>>,
    Error = std::io::Error,
    Future = impl Send,
> + Clone {
    let calls = calls.clone();
    tower::service_fn(move |request: Req| {
        calls.fetch_add(1, Ordering::SeqCst);
        async move {
            if request.uri().path() == "/fail" {
                return Err(std::io::Error::other("inner failure"));
            }
            Ok(http::Response::new(Full::new(Bytes::from("ok"))))
        }
    })
}

fn get(path: &str) -> Req {
    http::Request::get(path).body(()).unwrap()
}

#[tokio::test]
async fn a_refusal_is_a_typed_error_and_the_inner_service_is_not_called() {
    let clock = admission_testkit::FakeClock::new();
    let monitor = Monitor::builder().clock(clock.shared()).build();
    let circuit = Refusal::temporary("circuit open", Duration::from_millis(1_500));
    let upstream = Refusing::new("upstream", circuit);
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = AdmissionLayer::new(monitor.clone(), move |_: &Req| {
        let demand = Demand::new().with(upstream.clone(), Amount::ONE);
        Ok::<_, DemandError>((demand, JobContext::new("call")))
    });
    let error = layer
        .layer(inner(&calls))
        .oneshot(get("/"))
        .await
        .unwrap_err();
    let AdmissionError::Refused(refused) = &error else {
        panic!("expected a refusal, got {error:?}");
    };
    assert_eq!(refused.reason(), Reason::CircuitOpen);
    assert_eq!(error.retry_after(), Some(Duration::from_millis(1_500)));
    assert_eq!(refused.retry_after_secs(), Some(2));
    assert_eq!(refused.account(), Some("upstream"));
    assert_eq!(refused.waited(), Duration::ZERO);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    monitor.stop();
}

#[tokio::test]
async fn a_refusal_without_a_time_of_its_own_carries_the_layers_estimate() {
    let clock = admission_testkit::FakeClock::new();
    let monitor = Monitor::builder().clock(clock.shared()).build();
    let gate = Arc::new(CountingGate::new("workers", 2, monitor.clock().clone()).unwrap());
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = AdmissionLayer::new(monitor.clone(), move |_: &Req| {
        let demand = Demand::new().with(gate.clone(), Amount::ONE);
        Ok::<_, DemandError>((demand, JobContext::new("call")))
    })
    .retry_estimate(RetryEstimate::new().floor(Duration::from_secs(7)));
    monitor.stop();
    let error = layer
        .layer(inner(&calls))
        .oneshot(get("/"))
        .await
        .unwrap_err();
    let refused = error.refused().expect("a refusal");
    assert_eq!(refused.reason(), Reason::Unavailable);
    let estimate = RetryAfter::Estimated(Duration::from_secs(7));
    assert_eq!(refused.retry_hint(), Some(estimate));
    assert_eq!(error.retry_after(), Some(Duration::from_secs(7)));
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn the_body_holds_the_grant_and_an_inner_failure_releases_it() {
    let monitor = Monitor::new();
    let gate = Arc::new(CountingGate::new("workers", 2, monitor.clock().clone()).unwrap());
    let calls = Arc::new(AtomicUsize::new(0));
    let permit = gate.clone();
    let layer = AdmissionLayer::new(monitor.clone(), move |_: &Req| {
        let demand = Demand::new().with(permit.clone(), Amount::ONE);
        Ok::<_, DemandError>((demand, JobContext::new("call")))
    });
    let service = layer.layer(inner(&calls));

    let response = service.clone().oneshot(get("/")).await.unwrap();
    assert!(response.body().holds_grant());
    assert_eq!(gate.in_use(), 1);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "ok");
    assert_eq!(gate.in_use(), 0);

    let failed = service.clone().oneshot(get("/fail")).await.unwrap_err();
    assert!(matches!(failed, AdmissionError::Inner(ref e) if e.to_string() == "inner failure"));
    assert_eq!(failed.retry_after(), None);
    assert_eq!(gate.in_use(), 0);

    let dropped = service.oneshot(get("/")).await.unwrap();
    assert_eq!(gate.in_use(), 1);
    drop(dropped);
    assert_eq!(gate.in_use(), 0);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    monitor.stop();
}
