//! `--metrics ADDR`: the monitor's events as Prometheus series, served at `http://ADDR/metrics`
//! while the run lasts.
//!
//! The series are `admission_events::MetricsSink`'s (admitted by path, rejected by reason,
//! released by kind, the wait in seconds by outcome, the waiters gauge, holds by account; see
//! its module docs), recorded through the `metrics` facade into `metrics-exporter-prometheus`'s
//! recorder, whose HTTP listener answers scrapes (on any path; `/metrics` is Prometheus's
//! default). The sink is one more sink behind the run's
//! `Fanout`, beside the tally and the events file (`events.rs`). The wait is a histogram with
//! fixed buckets (simulated seconds, as every wait in this example), so the fleet's processes'
//! series add up in Prometheus.

use std::net::SocketAddr;
use std::sync::Arc;

use admission_events::MetricsSink;
use admission_events::metrics::WAIT;
use anyhow::Context as _;
use metrics_exporter_prometheus::{ExporterFuture, Matcher, PrometheusBuilder, PrometheusRecorder};

/// The upper bounds of the `admission_wait` buckets, in seconds.
pub const WAIT_BUCKETS: [f64; 8] = [0.001, 0.01, 0.1, 1.0, 10.0, 60.0, 600.0, 3600.0];

/// The recorder and its listener, bound to `addr` but not yet serving.
///
/// Must be called inside a tokio runtime (the exporter spawns its upkeep task on it).
///
/// # Errors
///
/// When `addr` cannot be bound (in use, not an address of this host, no permission).
pub fn bind(addr: SocketAddr) -> anyhow::Result<(PrometheusRecorder, ExporterFuture)> {
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets_for_metric(Matcher::Full(WAIT.to_owned()), &WAIT_BUCKETS)
        .context("configuring the wait buckets")?
        .build()
        .with_context(|| format!("serving metrics on {addr}"))
}

/// The endpoint while it serves; dropping it stops the listener.
#[derive(Debug)]
pub struct Serving {
    /// The sink to put behind the monitor's fanout: it records into the installed recorder.
    pub sink: Arc<MetricsSink>,
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Serving {
    /// The address the endpoint listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Binds `addr`, installs the recorder as the process's, and serves `/metrics` on the current
/// tokio runtime until the returned [`Serving`] is dropped.
///
/// # Errors
///
/// When `addr` cannot be bound, or a recorder was already installed.
pub fn serve(addr: SocketAddr) -> anyhow::Result<Serving> {
    let (recorder, exporter) = bind(addr)?;
    metrics::set_global_recorder(recorder)
        .map_err(|_| anyhow::anyhow!("a metrics recorder is already installed"))?;
    let task = tokio::spawn(async move {
        if let Err(error) = exporter.await {
            eprintln!("metrics endpoint on {addr} stopped: {error:?}");
        }
    });
    // Created after the recorder is installed, so its series are described there.
    let sink = Arc::new(MetricsSink::new());
    Ok(Serving { sink, addr, task })
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, SocketAddr, TcpListener};
    use std::sync::Arc;
    use std::time::Duration;

    use admission_accounts::CountingGate;
    use admission_core::{Amount, Demand, JobContext, Monitor};
    use admission_events::MetricsSink;
    use admission_testkit::FakeClock;
    use admission_testkit::monitor::poll_once;
    use http_body_util::{BodyExt as _, Empty};

    use super::bind;

    /// A port free on loopback now (bound, read, released: the exporter binds it next).
    fn free_port() -> SocketAddr {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("binding loopback");
        listener.local_addr().expect("the bound address")
    }

    /// `GET path` over HTTP/1 with hyper's client: the status and the body.
    async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .expect("connecting to the endpoint");
        let io = hyper_util::rt::TokioIo::new(stream);
        let (mut send, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .expect("the HTTP/1 handshake");
        let connection = tokio::spawn(conn);
        let request = hyper::Request::get(path)
            .header(hyper::header::HOST, addr.to_string())
            .body(Empty::<bytes::Bytes>::new())
            .expect("a valid request");
        let response = send.send_request(request).await.expect("a response");
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .expect("the body")
            .to_bytes();
        connection.abort();
        (status, String::from_utf8(body.to_vec()).expect("UTF-8"))
    }

    /// The scrape's metric families (each its `# HELP` and `# TYPE` lines, then its samples),
    /// sorted: the exporter's order of families and of label sets is not part of the format.
    fn families(text: &str) -> Vec<Vec<&str>> {
        let mut families: Vec<Vec<&str>> = Vec::new();
        for line in text.lines().filter(|line| !line.is_empty()) {
            match families.last_mut() {
                Some(family) if !line.starts_with("# HELP ") => family.push(line),
                _ => families.push(vec![line]),
            }
        }
        for family in &mut families {
            family[2..].sort_unstable();
        }
        families.sort();
        families
    }

    /// The monitor's events, recorded through `MetricsSink` into the exporter's recorder (as the
    /// thread's recorder, so no other test sees it), come back from `/metrics` as exact lines: an
    /// immediate grant, a hold of 250 ms on the fake clock then a grant, a demand that can never
    /// fit, two releases.
    #[tokio::test(flavor = "current_thread")]
    async fn the_endpoint_serves_the_monitor_series() {
        let addr = free_port();
        let (recorder, exporter) = bind(addr).expect("binding the endpoint");
        let serving = tokio::spawn(exporter);

        let clock = FakeClock::new();
        metrics::with_local_recorder(&recorder, || {
            let sink = Arc::new(MetricsSink::new());
            // Manual passes: every event is emitted on this thread, in this order.
            let monitor = Monitor::builder()
                .clock(clock.shared())
                .sink(sink)
                .manual_passes()
                .build();
            let gate = Arc::new(CountingGate::new("db:results", 1, clock.shared()).unwrap());
            let one = || Demand::new().with(gate.clone(), Amount::ONE);

            let first = monitor
                .admit_blocking(one(), &JobContext::new("first"), None)
                .expect("granted at once");
            let mut second = monitor.admit(one(), &JobContext::new("second"), None);
            assert!(poll_once(&mut second).is_none(), "the second waits");
            clock.advance(Duration::from_millis(250));
            drop(first); // hands the permit to the second, on this thread
            let second = poll_once(&mut second)
                .expect("granted by the release")
                .expect("granted, not refused");
            let too_large = Demand::new().with(gate.clone(), Amount::units(2));
            let refused = monitor.admit_blocking(too_large, &JobContext::new("third"), None);
            assert!(refused.is_err(), "2 permits never fit a gate of 1");
            drop(second);
            monitor.stop();
        });

        let (status, body) = get(addr, "/metrics").await;
        assert_eq!(status, 200);
        let expected = [
            "# HELP admission_admitted jobs granted their whole demand, by path",
            "# TYPE admission_admitted counter",
            "admission_admitted{path=\"after_wait\"} 1",
            "admission_admitted{path=\"immediate\"} 1",
            "# HELP admission_held waiters held, by the account that held them",
            "# TYPE admission_held counter",
            "admission_held{account=\"db:results\"} 1",
            "# HELP admission_rejected jobs refused, by reason",
            "# TYPE admission_rejected counter",
            "admission_rejected{reason=\"circuit_blocked\"} 1",
            "# HELP admission_released grants given back, by kind",
            "# TYPE admission_released counter",
            "admission_released{kind=\"release\"} 2",
            "# HELP admission_waiters jobs waiting in the line now",
            "# TYPE admission_waiters gauge",
            "admission_waiters 0",
            "# HELP admission_wait how long a job waited, by outcome",
            "# TYPE admission_wait histogram",
            "admission_wait_bucket{outcome=\"circuit_blocked\",le=\"0.001\"} 1",
            "admission_wait_bucket{outcome=\"circuit_blocked\",le=\"0.01\"} 1",
            "admission_wait_bucket{outcome=\"circuit_blocked\",le=\"0.1\"} 1",
            "admission_wait_bucket{outcome=\"circuit_blocked\",le=\"1\"} 1",
            "admission_wait_bucket{outcome=\"circuit_blocked\",le=\"10\"} 1",
            "admission_wait_bucket{outcome=\"circuit_blocked\",le=\"60\"} 1",
            "admission_wait_bucket{outcome=\"circuit_blocked\",le=\"600\"} 1",
            "admission_wait_bucket{outcome=\"circuit_blocked\",le=\"3600\"} 1",
            "admission_wait_bucket{outcome=\"circuit_blocked\",le=\"+Inf\"} 1",
            "admission_wait_sum{outcome=\"circuit_blocked\"} 0",
            "admission_wait_count{outcome=\"circuit_blocked\"} 1",
            "admission_wait_bucket{outcome=\"granted\",le=\"0.001\"} 1",
            "admission_wait_bucket{outcome=\"granted\",le=\"0.01\"} 1",
            "admission_wait_bucket{outcome=\"granted\",le=\"0.1\"} 1",
            "admission_wait_bucket{outcome=\"granted\",le=\"1\"} 2",
            "admission_wait_bucket{outcome=\"granted\",le=\"10\"} 2",
            "admission_wait_bucket{outcome=\"granted\",le=\"60\"} 2",
            "admission_wait_bucket{outcome=\"granted\",le=\"600\"} 2",
            "admission_wait_bucket{outcome=\"granted\",le=\"3600\"} 2",
            "admission_wait_bucket{outcome=\"granted\",le=\"+Inf\"} 2",
            "admission_wait_sum{outcome=\"granted\"} 0.25",
            "admission_wait_count{outcome=\"granted\"} 2",
        ];
        assert_eq!(
            families(&body),
            families(&expected.join("\n")),
            "the whole scrape:\n{body}"
        );

        serving.abort();
    }

    /// An address that is already taken is a typed error naming it, not a panic.
    #[tokio::test(flavor = "current_thread")]
    async fn an_address_in_use_is_an_error() {
        let taken = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("binding loopback");
        let addr = taken.local_addr().expect("the bound address");
        let Err(error) = bind(addr) else {
            panic!("{addr} was bound twice");
        };
        assert_eq!(error.to_string(), format!("serving metrics on {addr}"));
        assert_eq!(error.chain().count(), 2, "the cause is kept: {error:#}");
    }
}
