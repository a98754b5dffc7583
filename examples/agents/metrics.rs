//! `--metrics ADDR`: the monitor's events as Prometheus series, served at `http://ADDR/metrics`
//! while the run lasts, and after it until one more scrape has been served (at most
//! `--metrics-linger` seconds), so the run's last values are read.
//!
//! The series are `admission_events::MetricsSink`'s (admitted, rejected and released counters,
//! the wait in real seconds by outcome, the waiters gauge, holds by account; see its module
//! docs), recorded through the `metrics` facade into `metrics-exporter-prometheus`'s recorder
//! and rendered by its handle on every scrape of this module's own HTTP endpoint (on any path;
//! `/metrics` is Prometheus's default), which counts the scrapes it serves. The sink is one more
//! sink behind the run's `Fanout`, beside the tally and the events file (`events.rs`). The run's
//! clock is simulated (`--time-scale`): the sink divides waits back into real seconds for
//! `admission_wait_seconds`, and the simulated ones are `admission_simulated_wait_seconds`. Both
//! are histograms with fixed buckets, so the fleet's processes' series add up in Prometheus.
//! Every counter starts at zero, so the first scrape already lists every series.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use admission_events::MetricsSink;
use admission_events::metrics::{SIMULATED_WAIT, WAIT};
use anyhow::Context as _;
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};
use tokio::sync::Notify;

/// The upper bounds of the wait buckets, in seconds (real and simulated alike).
pub const WAIT_BUCKETS: [f64; 8] = [0.001, 0.01, 0.1, 1.0, 10.0, 60.0, 600.0, 3600.0];

/// How often the recorder's upkeep runs (it drains histograms' rolling summaries).
const UPKEEP: Duration = Duration::from_secs(5);

/// The recorder, with the wait buckets set (for the OpenTelemetry-named durations too: the time
/// in the line and a lease's duration).
///
/// # Errors
///
/// When the buckets are refused (never, for these constants).
pub fn recorder() -> anyhow::Result<PrometheusRecorder> {
    use admission_events::metrics::{OTEL_LEASE_DURATION, OTEL_TIME_IN_QUEUE};
    Ok(PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(WAIT.to_owned()), &WAIT_BUCKETS)
        .context("configuring the wait buckets")?
        .set_buckets_for_metric(Matcher::Full(SIMULATED_WAIT.to_owned()), &WAIT_BUCKETS)
        .context("configuring the simulated wait buckets")?
        .set_buckets_for_metric(Matcher::Full(OTEL_TIME_IN_QUEUE.to_owned()), &WAIT_BUCKETS)
        .context("configuring the time-in-queue buckets")?
        .set_buckets_for_metric(Matcher::Full(OTEL_LEASE_DURATION.to_owned()), &WAIT_BUCKETS)
        .context("configuring the lease-duration buckets")?
        .build_recorder())
}

/// The scrapes an endpoint has served, and a wake-up for each.
#[derive(Debug, Default)]
pub struct Scrapes {
    served: AtomicU64,
    notify: Notify,
}

impl Scrapes {
    /// How many scrapes have been served.
    pub fn served(&self) -> u64 {
        self.served.load(Ordering::Acquire)
    }

    /// Waits until more than `seen` scrapes have been served, at most `wait`; whether one was.
    pub async fn after(&self, seen: u64, wait: Duration) -> bool {
        let waited = tokio::time::timeout(wait, async {
            loop {
                let notified = self.notify.notified();
                if self.served() > seen {
                    return;
                }
                notified.await;
            }
        });
        waited.await.is_ok()
    }
}

/// Serves `handle`'s rendering on `listener` (any path), counting scrapes in `scrapes`, until
/// the task is aborted.
async fn endpoint(
    listener: tokio::net::TcpListener,
    handle: PrometheusHandle,
    scrapes: Arc<Scrapes>,
) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let (handle, scrapes) = (handle.clone(), scrapes.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |_request| {
                let body = handle.render();
                scrapes.served.fetch_add(1, Ordering::AcqRel);
                scrapes.notify.notify_waiters();
                async move {
                    Ok::<_, Infallible>(
                        hyper::Response::builder()
                            .header(
                                hyper::header::CONTENT_TYPE,
                                "text/plain; version=0.0.4; charset=utf-8",
                            )
                            .body(http_body_util::Full::new(bytes::Bytes::from(body)))
                            .expect("a valid response"),
                    )
                }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(io, service)
                .await;
        });
    }
}

/// Binds `addr` and serves `handle` there on the current tokio runtime: the endpoint's task and
/// its scrape count.
///
/// # Errors
///
/// When `addr` cannot be bound (in use, not an address of this host, no permission).
pub fn bind(
    addr: SocketAddr,
    handle: PrometheusHandle,
) -> anyhow::Result<(tokio::task::JoinHandle<()>, Arc<Scrapes>)> {
    let listener = std::net::TcpListener::bind(addr)
        .and_then(|listener| {
            listener.set_nonblocking(true)?;
            tokio::net::TcpListener::from_std(listener)
        })
        .with_context(|| format!("serving metrics on {addr}"))?;
    let scrapes = Arc::new(Scrapes::default());
    let task = tokio::spawn(endpoint(listener, handle, scrapes.clone()));
    Ok((task, scrapes))
}

/// The endpoint while it serves; dropping it stops the listener.
#[derive(Debug)]
pub struct Serving {
    /// The sink to put behind the monitor's fanout: it records into the installed recorder.
    pub sink: Arc<MetricsSink>,
    addr: SocketAddr,
    scrapes: Arc<Scrapes>,
    tasks: [tokio::task::JoinHandle<()>; 2],
}

impl Serving {
    /// The address the endpoint listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Keeps serving until one more scrape has been served, at most `wait`: whether one was.
    pub async fn linger(&self, wait: Duration) -> bool {
        self.scrapes.after(self.scrapes.served(), wait).await
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Binds `addr`, installs the recorder as the process's, and serves `/metrics` on the current
/// tokio runtime until the returned [`Serving`] is dropped; the monitor's clock runs
/// `time_scale` times faster than real time. With `fair`'s tenants the series carry a `tenant`
/// label (and the units granted to each are counted), with its levels a `level` label.
///
/// # Errors
///
/// When `addr` cannot be bound, or a recorder was already installed.
pub fn serve(
    addr: SocketAddr,
    time_scale: u32,
    fair: Option<&crate::fairness::Config>,
) -> anyhow::Result<Serving> {
    let recorder = recorder()?;
    let handle = recorder.handle();
    let (endpoint, scrapes) = bind(addr, handle.clone())?;
    metrics::set_global_recorder(recorder)
        .map_err(|_| anyhow::anyhow!("a metrics recorder is already installed"))?;
    let upkeep = tokio::spawn(async move {
        loop {
            tokio::time::sleep(UPKEEP).await;
            handle.run_upkeep();
        }
    });
    // Created after the recorder is installed, so its series are described and zeroed there.
    let rate = f64::from(time_scale.max(1));
    let mut sink = match fair.filter(|f| !f.tenants.is_empty()) {
        Some(fair) => MetricsSink::with_tenants(fair.tenants.iter().map(|t| t.name.as_str()), rate),
        None => MetricsSink::simulated(rate),
    };
    if let Some(levels) = fair.and_then(|f| f.levels.as_ref()) {
        sink = sink.with_levels(levels);
    }
    let sink = Arc::new(sink);
    Ok(Serving {
        sink,
        addr,
        scrapes,
        tasks: [endpoint, upkeep],
    })
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

    use super::{WAIT_BUCKETS, bind, recorder};

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
    /// thread's recorder, so no other test sees it), come back from the endpoint as exact lines:
    /// an immediate grant, a hold of 250 ms on the fake clock then a grant, a demand that can
    /// never fit, two releases; every other counter of a fixed label set at zero.
    #[tokio::test(flavor = "current_thread")]
    async fn the_endpoint_serves_the_monitor_series() {
        let addr = free_port();
        let recorder = recorder().expect("the recorder");
        let (serving, scrapes) = bind(addr, recorder.handle()).expect("binding the endpoint");

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
            let mut second = Box::pin(monitor.admit(one(), &JobContext::new("second"), None));
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
        assert_eq!(scrapes.served(), 1);
        let mut expected = vec![
            "# HELP admission_admitted_total jobs granted their whole demand, by path",
            "# TYPE admission_admitted_total counter",
            "admission_admitted_total{path=\"after_wait\"} 1",
            "admission_admitted_total{path=\"immediate\"} 1",
            "# HELP admission_held_total waiters held, by the account that held them",
            "# TYPE admission_held_total counter",
            "admission_held_total{account=\"db:results\"} 1",
            "# HELP admission_rejected_total jobs refused, by reason",
            "# TYPE admission_rejected_total counter",
            "admission_rejected_total{reason=\"aborted\"} 0",
            "admission_rejected_total{reason=\"cancelled\"} 0",
            "admission_rejected_total{reason=\"circuit_blocked\"} 1",
            "admission_rejected_total{reason=\"closed\"} 0",
            "admission_rejected_total{reason=\"shutdown\"} 0",
            "admission_rejected_total{reason=\"timed_out\"} 0",
            "# HELP admission_released_total grants given back, by kind",
            "# TYPE admission_released_total counter",
            "admission_released_total{kind=\"release\"} 2",
            "admission_released_total{kind=\"rollback\"} 0",
            "# HELP admission_waiters jobs waiting in the line now",
            "# TYPE admission_waiters gauge",
            "admission_waiters 0",
            "# HELP admission_wait_seconds how long a job waited, by outcome, in real seconds",
            "# TYPE admission_wait_seconds histogram",
        ];
        let buckets = |outcome: &str, counts: [u32; 8], total: u32, sum: &str| {
            let mut lines: Vec<String> = WAIT_BUCKETS
                .iter()
                .zip(counts)
                .map(|(le, n)| {
                    format!(
                        "admission_wait_seconds_bucket{{outcome=\"{outcome}\",le=\"{le}\"}} {n}"
                    )
                })
                .collect();
            lines.push(format!(
                "admission_wait_seconds_bucket{{outcome=\"{outcome}\",le=\"+Inf\"}} {total}"
            ));
            lines.push(format!(
                "admission_wait_seconds_sum{{outcome=\"{outcome}\"}} {sum}"
            ));
            lines.push(format!(
                "admission_wait_seconds_count{{outcome=\"{outcome}\"}} {total}"
            ));
            lines
        };
        let blocked = buckets("circuit_blocked", [1; 8], 1, "0");
        let granted = buckets("granted", [1, 1, 1, 2, 2, 2, 2, 2], 2, "0.25");
        expected.extend(blocked.iter().chain(&granted).map(String::as_str));
        // The Prometheus-named families, whole; the OpenTelemetry-named ones (the same facts,
        // `admission_events::metrics`) by their counts.
        let (otel, prometheus): (Vec<Vec<&str>>, Vec<Vec<&str>>) = families(&body)
            .into_iter()
            .partition(|family| family[0].starts_with("# HELP admission_rate_limiting_"));
        let otel: Vec<&str> = otel.concat();
        for line in [
            "admission_rate_limiting_requests{admission_rate_limiting_result=\"acquired\"} 2",
            "admission_rate_limiting_requests{admission_rate_limiting_result=\"circuit_blocked\"} 1",
            "admission_rate_limiting_queued_requests 0",
            "admission_rate_limiting_active_request_leases 0",
            "# TYPE admission_rate_limiting_request_time_in_queue histogram",
            "admission_rate_limiting_request_time_in_queue_count{admission_rate_limiting_result=\"acquired\"} 1",
            "# TYPE admission_rate_limiting_request_lease_duration histogram",
            "admission_rate_limiting_request_lease_duration_count 2",
        ] {
            assert!(otel.contains(&line), "no {line:?} in the scrape:\n{body}");
        }
        assert_eq!(
            prometheus,
            families(&expected.join("\n")),
            "the whole scrape:\n{body}"
        );

        serving.abort();
    }

    /// A scrape in Prometheus's text format (version 0.0.4), read as its specification lays it
    /// out: `# HELP family text` and `# TYPE family kind` lines, and one `name{labels} value`
    /// line per sample (a histogram's samples are its family's `_bucket`, `_sum` and `_count`).
    /// Small enough to read here, which keeps a text-format parser (and the regex engine it
    /// pulls in) out of what the example compiles.
    struct Scrape {
        /// Each sample's name and its family's kind.
        samples: Vec<(String, String)>,
        /// The families that have help text.
        docs: std::collections::BTreeSet<String>,
    }

    impl Scrape {
        fn parse(text: &str) -> Scrape {
            let mut kinds = std::collections::BTreeMap::new();
            let mut docs = std::collections::BTreeSet::new();
            let mut names = Vec::new();
            for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
                let mut words = line.split_whitespace();
                match (words.next(), words.next(), words.next()) {
                    (Some("#"), Some("HELP"), Some(family)) => {
                        docs.insert(family.to_owned());
                    }
                    (Some("#"), Some("TYPE"), Some(family)) => {
                        kinds.insert(family.to_owned(), words.next().unwrap_or("").to_owned());
                    }
                    (Some("#"), ..) => {}
                    _ => {
                        let name = line.split(['{', ' ']).next().unwrap_or(line);
                        let value = line.rsplit(' ').next().unwrap_or("");
                        assert!(value.parse::<f64>().is_ok(), "not a sample: {line}");
                        names.push(name.to_owned());
                    }
                }
            }
            let samples = names
                .into_iter()
                .map(|name| {
                    let family = family_of(&name, &kinds);
                    let kind = kinds.get(family).cloned().unwrap_or_default();
                    (name, kind)
                })
                .collect();
            Scrape { samples, docs }
        }
    }

    /// The family a sample belongs to: itself, or a histogram's name before `_bucket`, `_sum`
    /// or `_count`.
    fn family_of<'a>(
        sample: &'a str,
        kinds: &std::collections::BTreeMap<String, String>,
    ) -> &'a str {
        if kinds.contains_key(sample) {
            return sample;
        }
        ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| {
                sample
                    .strip_suffix(suffix)
                    .filter(|f| kinds.contains_key(*f))
            })
            .unwrap_or(sample)
    }

    /// A real scrape, read as the text format lays it out: before any event it already lists
    /// every counter (at zero) and the gauges; after a simulated wait, the Prometheus-named
    /// counters end in `_total` and durations are `_seconds` (the OpenTelemetry-named series,
    /// `admission_rate_limiting_*`, carry their units in their help text instead), the real wait
    /// is the simulated one divided by the clock's rate, and every family has its help text.
    /// `Scrapes::after` wakes on a scrape.
    #[tokio::test(flavor = "current_thread")]
    async fn a_scrape_parses_and_follows_prometheus_conventions() {
        let addr = free_port();
        let recorder = recorder().expect("the recorder");
        let (serving, scrapes) = bind(addr, recorder.handle()).expect("binding the endpoint");
        let sink = metrics::with_local_recorder(&recorder, || MetricsSink::simulated(300.0));

        let (_, first) = get(addr, "/metrics").await;
        let parsed = Scrape::parse(&first);
        // 11 Prometheus-named series and 9 OpenTelemetry-named ones (7 counters by result, 2
        // gauges).
        assert_eq!(parsed.samples.len(), 20, "every zeroed series:\n{first}");

        let clock = FakeClock::new();
        metrics::with_local_recorder(&recorder, || {
            let monitor = Monitor::builder()
                .clock(clock.shared())
                .sink(Arc::new(sink))
                .manual_passes()
                .build();
            let gate = Arc::new(CountingGate::new("http", 1, clock.shared()).unwrap());
            let one = || Demand::new().with(gate.clone(), Amount::ONE);
            let first = monitor
                .admit_blocking(one(), &JobContext::new("first"), None)
                .expect("granted at once");
            let mut second = Box::pin(monitor.admit(one(), &JobContext::new("second"), None));
            assert!(poll_once(&mut second).is_none());
            clock.advance(Duration::from_secs(30)); // 0.1 s of real time at 300x
            drop(first);
            drop(poll_once(&mut second).expect("granted").expect("granted"));
            monitor.stop();
        });
        let seen = scrapes.served();
        let waiting = tokio::spawn({
            let scrapes = scrapes.clone();
            async move { scrapes.after(seen, Duration::from_secs(10)).await }
        });
        let (_, body) = get(addr, "/metrics").await;
        assert!(
            waiting.await.expect("the waiter"),
            "a scrape wakes the linger"
        );
        let parsed = Scrape::parse(&body);
        assert!(!parsed.samples.is_empty(), "{body}");
        for (sample, kind) in &parsed.samples {
            let family = sample
                .trim_end_matches("_bucket")
                .trim_end_matches("_sum")
                .trim_end_matches("_count");
            assert!(parsed.docs.contains(family), "{sample} has no help text");
            if sample.starts_with("admission_rate_limiting_") {
                continue;
            }
            match kind.as_str() {
                "counter" => assert!(sample.ends_with("_total"), "{sample}"),
                "histogram" | "summary" => assert!(family.ends_with("_seconds"), "{sample}"),
                _ => {}
            }
        }
        let sum = |name: &str| {
            body.lines()
                .find(|l| l.starts_with(&format!("{name}_sum{{outcome=\"granted\"}}")))
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or_else(|| panic!("no {name}_sum in:\n{body}"))
        };
        assert_eq!(sum("admission_simulated_wait_seconds"), 30.0);
        assert!((sum("admission_wait_seconds") - 0.1).abs() < 1e-9);

        serving.abort();
    }

    /// An address that is already taken is a typed error naming it, not a panic.
    #[tokio::test(flavor = "current_thread")]
    async fn an_address_in_use_is_an_error() {
        let taken = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("binding loopback");
        let addr = taken.local_addr().expect("the bound address");
        let handle = recorder().expect("the recorder").handle();
        let Err(error) = bind(addr, handle) else {
            panic!("{addr} was bound twice");
        };
        assert_eq!(error.to_string(), format!("serving metrics on {addr}"));
        assert_eq!(error.chain().count(), 2, "the cause is kept: {error:#}");
    }
}
