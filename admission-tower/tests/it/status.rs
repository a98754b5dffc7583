//! Refusals become the statuses the `http` feature promises, with exact `Retry-After` values
//! (every 503 has one; a demand that can never fit has none, and names its numbers); a handler
//! of one's own replaces the mapping; a handler reads how long its request waited.

use std::sync::Arc;
use std::time::Duration;

use admission_accounts::CountingGate;
use admission_core::{Amount, Capability, Demand, JobContext, Monitor, Refusal};
use admission_testkit::FakeClock;
use admission_tower::{AdmissionLayer, DemandError, Reason, Refused};
use axum::extract::Request;
use http_body_util::BodyExt;

use crate::{Events, Refusing, Server, Streams, fetch, one_permit_of, routes};

/// The accounts a request names with its `x-demand` header.
#[derive(Clone)]
pub struct Cases {
    workers: Arc<CountingGate>,
    uploads: Arc<CountingGate>,
    upstream: Arc<Refusing>,
    tenant: Arc<Refusing>,
    tenant_now: Arc<Refusing>,
    tenant_big: Arc<Refusing>,
    window: Arc<Refusing>,
}

impl Cases {
    /// The accounts, on `monitor`'s clock.
    pub fn new(monitor: &Monitor) -> Cases {
        let clock = monitor.clock().clone();
        let circuit = Refusal::temporary("circuit open", Duration::from_millis(2_500));
        Cases {
            workers: Arc::new(CountingGate::new("workers", 1, clock.clone()).unwrap()),
            uploads: Arc::new(CountingGate::new("upload-bytes", 1_000, clock).unwrap()),
            upstream: Refusing::new("upstream", circuit),
            tenant: Refusing::new(
                "tenant",
                Refusal::temporary("spent", Duration::from_secs(2)),
            ),
            tenant_now: Refusing::new("tenant-now", Refusal::temporary("spent", Duration::ZERO)),
            // A quota whose whole window holds 2: a demand of 5 can never fit it.
            tenant_big: Refusing::new(
                "tenant-big",
                Refusal::too_large(Amount::units(5), Amount::units(2)),
            ),
            window: Arc::new(Refusing {
                name: "window",
                refusal: Refusal::new("unused"),
                requires: Some(Capability::HTTP_CONNECTION),
            }),
        }
    }

    /// A layer over these cases on `monitor`: `upload-bytes` counts bytes, `tenant`,
    /// `tenant-now` and `tenant-big` are quotas.
    pub fn layer(
        &self,
        monitor: &Monitor,
    ) -> AdmissionLayer<
        impl Fn(&Request) -> Result<(Demand, JobContext), DemandError> + Send + Sync + 'static,
    > {
        let cases = self.clone();
        AdmissionLayer::new(monitor.clone(), move |request: &Request| {
            cases.demand(request)
        })
        .bytes_account("upload-bytes")
        .quota_account("tenant")
        .quota_account("tenant-now")
        .quota_account("tenant-big")
    }

    /// The one `workers` permit, taken outside the layer (released when the grant drops).
    pub fn hold_workers(&self, monitor: &Monitor) -> admission_core::Grant {
        let demand = Demand::new().with(self.workers.clone(), Amount::ONE);
        let job = JobContext::new("holder");
        monitor.try_admit(&demand, &job).unwrap().into_owned()
    }

    fn demand(&self, request: &Request) -> Result<(Demand, JobContext), DemandError> {
        let header = |name: &str| request.headers().get(name).and_then(|v| v.to_str().ok());
        let one = |account: admission_core::AccountRef| Demand::new().with(account, Amount::ONE);
        let demand = match header("x-demand") {
            Some("ok") => one(self.workers.clone()),
            Some("circuit") => one(self.upstream.clone()),
            Some("quota") => one(self.tenant.clone()),
            Some("quota-now") => one(self.tenant_now.clone()),
            Some("quota-too-large") => one(self.tenant_big.clone()),
            Some("too-many") => Demand::new().with(self.workers.clone(), Amount::units(2)),
            Some("unmet") => one(self.window.clone()),
            Some("spent") => {
                let reset = Some(Duration::from_secs(90));
                return Err(DemandError::quota("the spend cap is spent", reset));
            }
            Some("bytes") => {
                let bytes = header("x-bytes")
                    .and_then(|v| v.parse::<u64>().ok())
                    .ok_or_else(|| DemandError::invalid("x-bytes must be a number"))?;
                Demand::new().with(self.uploads.clone(), Amount::units(bytes))
            }
            _ => return Err(DemandError::invalid("unknown x-demand")),
        };
        Ok((demand, JobContext::new("request")))
    }
}

pub fn refused(reason: &str) -> String {
    format!("admission refused: {reason}\n")
}

/// The body of a refusal of a demand that can never fit the counting gate `gate` of `capacity`
/// permits, asked `asked`.
pub fn never_fits(reason: &str, gate: &str, asked: u64, capacity: u64) -> String {
    format!(
        "admission refused: {reason}: account `{gate}` asked {asked}, capacity {capacity}: \
         `{gate}` has {capacity} permits in all; a demand of {asked} can never fit (ask for at \
         most {capacity})\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refusal_maps_to_its_status_and_retry_after() {
    // A clock that stands still: the estimate after the stop below is exactly the floor.
    let clock = FakeClock::new();
    let monitor = Monitor::builder().clock(clock.shared()).build();
    let cases = Cases::new(&monitor);
    let layer = cases.layer(&monitor).http_responses();
    let server = Server::start(routes(&Streams::default()).layer(layer)).await;

    type Case<'a> = (&'a [(&'a str, &'a str)], (u16, Option<&'a str>, String));
    // A demand that can never fit a quota account is 422, not a 429 a client would retry (the
    // code before issue 37 answered `429` and `admission refused: quota`).
    let quota_too_large = "admission refused: too_large: account `tenant-big` asked 5, capacity \
                           2: asks 5, more than the 2 it can ever grant at once\n";
    let table: [Case<'_>; 11] = [
        (&[("x-demand", "ok")], (200, None, "hello".into())),
        (
            &[("x-demand", "circuit")],
            (503, Some("3"), refused("circuit_open")),
        ),
        (&[("x-demand", "quota")], (429, Some("2"), refused("quota"))),
        (
            &[("x-demand", "quota-now")],
            (429, Some("1"), refused("quota")),
        ),
        (
            &[("x-demand", "spent")],
            (429, Some("90"), refused("quota")),
        ),
        (
            &[("x-demand", "too-many")],
            (422, None, never_fits("too_large", "workers", 2, 1)),
        ),
        (
            &[("x-demand", "quota-too-large")],
            (422, None, quota_too_large.into()),
        ),
        (
            &[("x-demand", "bytes"), ("x-bytes", "5000")],
            (
                413,
                None,
                never_fits("too_large_bytes", "upload-bytes", 5000, 1000),
            ),
        ),
        (
            &[("x-demand", "bytes"), ("x-bytes", "-1")],
            (400, None, refused("invalid")),
        ),
        (&[], (400, None, refused("invalid"))),
        (
            &[("x-demand", "unmet")],
            (500, None, refused("misconfigured")),
        ),
    ];
    for (headers, (status, retry_after, body)) in table {
        let expected = (status, retry_after.map(str::to_owned), body);
        assert_eq!(
            fetch(server.addr, "/hello", headers).await,
            expected,
            "{headers:?}"
        );
    }
    assert_eq!(cases.workers.in_use(), 0);
    assert_eq!(cases.uploads.in_use(), 0);

    // A stopped monitor knows no time to come back: the layer's estimate, here its floor.
    monitor.stop();
    let stopped = fetch(server.addr, "/hello", &[("x-demand", "ok")]).await;
    assert_eq!(stopped, (503, Some("1".into()), refused("unavailable")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_on_the_monitors_clock_is_503_with_an_estimated_retry_after() {
    let clock = FakeClock::new();
    let (sink, mut events) = Events::new();
    let monitor = Monitor::builder().clock(clock.shared()).sink(sink).build();
    let gate = Arc::new(CountingGate::new("workers", 1, monitor.clock().clone()).unwrap());
    let streams = Streams::default();
    let layer = AdmissionLayer::new(monitor.clone(), one_permit_of(&gate))
        .timeout(Duration::from_secs(5))
        .http_responses();
    let server = Server::start(routes(&streams).layer(layer)).await;

    let body = streams.open();
    let mut holder = server.get("/stream", &[]).await;
    let waiting = tokio::spawn(fetch(server.addr, "/hello", &[]));
    assert_eq!(events.until("held").await, None);
    clock.advance(Duration::from_millis(4_999));
    assert_eq!(monitor.queue_size(), 1, "not due yet");
    clock.advance(Duration::from_millis(1));
    // Nothing completed in the window: the estimate is the 5 s the request waited.
    let timed_out = (503, Some("5".to_owned()), refused("timed_out"));
    assert_eq!(waiting.await.unwrap(), timed_out);
    assert_eq!(monitor.queue_size(), 0);
    drop(body);
    assert!(holder.body_mut().frame().await.is_none());
    assert_eq!(gate.in_use(), 0);
    monitor.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_of_ones_own_replaces_the_mapping() {
    let monitor = Monitor::new();
    let cases = Cases::new(&monitor);
    let layer = cases.layer(&monitor).on_refusal(|refused: &Refused| {
        if refused.reason() == Reason::Quota {
            let mut response = http::Response::new(format!("pay up ({:?})\n", refused.account()));
            *response.status_mut() = http::StatusCode::PAYMENT_REQUIRED;
            return response;
        }
        admission_tower::http::response(refused)
    });
    let server = Server::start(routes(&Streams::default()).layer(layer)).await;

    let quota = fetch(server.addr, "/hello", &[("x-demand", "quota")]).await;
    assert_eq!(quota, (402, None, "pay up (Some(\"tenant\"))\n".to_owned()));
    let circuit = fetch(server.addr, "/hello", &[("x-demand", "circuit")]).await;
    assert_eq!(
        circuit,
        (503, Some("3".to_owned()), refused("circuit_open"))
    );
    monitor.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_reads_how_long_its_request_waited() {
    let clock = FakeClock::new();
    let (sink, mut events) = Events::new();
    let monitor = Monitor::builder().clock(clock.shared()).sink(sink).build();
    let gate = Arc::new(CountingGate::new("workers", 1, monitor.clock().clone()).unwrap());
    let streams = Streams::default();
    let layer = AdmissionLayer::new(monitor.clone(), one_permit_of(&gate)).http_responses();
    let server = Server::start(routes(&streams).layer(layer)).await;

    assert_eq!(
        fetch(server.addr, "/waited", &[]).await,
        (200, None, "0".to_owned())
    );
    let body = streams.open();
    let mut holder = server.get("/stream", &[]).await;
    let waiting = tokio::spawn(fetch(server.addr, "/waited", &[]));
    assert_eq!(events.until("held").await, None);
    clock.advance(Duration::from_millis(3_250));
    drop(body);
    assert!(holder.body_mut().frame().await.is_none());
    assert_eq!(waiting.await.unwrap(), (200, None, "3250".to_owned()));
    assert_eq!(gate.in_use(), 0);
    monitor.stop();
}
