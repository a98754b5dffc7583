//! A lost lease is reported three ways (the holder's future, a `warn` log line and a counter),
//! and the counters carry bounded labels only: never the tenant.

use std::io::Write;
use std::sync::{Arc, Mutex};

use admission_redis::{LeaseRequest, LossReason, Outcome};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

use crate::support::{ceilings, cell, config, connect, server};

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_lost_lease_is_logged_and_counted_with_bounded_labels() {
    let (host, port) = server("loss_metric");
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let log = Captured::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .without_time()
        .finish();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    metrics::with_local_recorder(&recorder, || {
        tracing::subscriber::with_default(subscriber, || {
            runtime.block_on(async {
                let cell = cell("loss_metric");
                let fleet = connect(config(&host, port, &cell, ceilings(100, 2, 100, 2, 2))).await;
                let lease = fleet
                    .try_acquire(&LeaseRequest::new(
                        "doomed",
                        "Tenant Secret",
                        "disk-a",
                        10,
                        "upload",
                    ))
                    .await
                    .expect("fits");
                fleet
                    .release_lease("doomed", lease.token(), Outcome::Failed)
                    .await
                    .expect("released elsewhere");
                assert!(lease.renew_now().await.is_err());
                assert_eq!(lease.lost().await, LossReason::Lost);
                drop(lease);
            });
        });
    });
    let log = String::from_utf8(log.0.lock().expect("lock").clone()).expect("utf-8");
    assert!(
        log.contains("WARN")
            && log.contains("admission-redis: lease lost")
            && log.contains("lease=doomed"),
        "{log}"
    );
    let metrics: Vec<_> = snapshotter.snapshot().into_vec();
    let find = |name: &str| {
        metrics
            .iter()
            .filter(|(key, ..)| key.key().name() == name)
            .map(|(key, _, _, value)| {
                let mut labels: Vec<String> = key
                    .key()
                    .labels()
                    .map(|l| format!("{}={}", l.key(), l.value()))
                    .collect();
                labels.sort();
                let count = match value {
                    DebugValue::Counter(n) => *n,
                    other => panic!("{name} is not a counter: {other:?}"),
                };
                (labels, count)
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        find("admission_redis_leases_lost_total"),
        vec![(
            vec!["operation=upload".to_string(), "outcome=lost".to_string()],
            1
        )]
    );
    assert_eq!(
        find("admission_redis_acquisitions_total"),
        vec![(
            vec![
                "backend=disk-a".to_string(),
                "operation=upload".to_string(),
                "outcome=admitted".to_string()
            ],
            1
        )]
    );
    for (key, ..) in &metrics {
        assert!(
            key.key().labels().all(|l| !l.value().contains("Tenant")),
            "{key:?}"
        );
    }
}
