//! Servers that go away, come back empty, evict, speak TLS, and a holder that is killed: each on
//! a private `redis-server`, or a second OS process, of the test's own.

use std::time::Duration;

use admission_redis::{
    AcquireError, ConnectError, EvictionCheck, LeaseRequest, LossReason, Outcome, QuotaError,
    Quotas, RedisAdmission, Secret, Tls, read_events,
};

use crate::support::{
    PrivateRedis, ceilings, cell, child_process, config, connect, redis_server_binary, server,
    wait_for_event,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_fails_closed_and_restarted_empty_resumes_with_greater_tokens() {
    let binary = redis_server_binary("stopped");
    let mut redis = PrivateRedis::start(&binary, &[]);
    let cell = cell("stopped");
    let mut cfg = config("127.0.0.1", redis.port, &cell, ceilings(100, 4, 100, 4, 4));
    cfg.quotas = Some(Quotas {
        requests_per_minute: 10,
        bytes_per_hour: 10,
    });
    cfg.reconnect_retries = 1;
    let fleet = connect(cfg).await;
    let held = fleet
        .try_acquire(&LeaseRequest::new("held", "t", "d", 10, "upload"))
        .await
        .expect("fits");
    let mut tokens = vec![held.token().0];
    for i in 0..3 {
        let lease = fleet
            .try_acquire(&LeaseRequest::new(format!("x{i}"), "t", "d", 1, "upload"))
            .await
            .expect("fits");
        tokens.push(lease.token().0);
        lease.release(Outcome::Completed).await.expect("released");
    }

    redis.stop();
    // New acquisitions and quota charges fail closed.
    let refused = fleet
        .try_acquire(&LeaseRequest::new("new", "t", "d", 1, "upload"))
        .await
        .unwrap_err();
    assert!(matches!(refused, AcquireError::Unavailable(_)), "{refused}");
    assert!(!refused.is_permanent());
    let waited = fleet
        .acquire(
            &LeaseRequest::new("new2", "t", "d", 1, "upload"),
            Duration::from_secs(2),
        )
        .await
        .unwrap_err();
    assert!(matches!(waited, AcquireError::Unavailable(_)), "{waited}");
    assert!(matches!(
        fleet.charge_request("t").await,
        Err(QuotaError::Unavailable(_))
    ));
    // The held lease cannot be renewed: its holder is told once the local deadline (last
    // successful renewal + 3 s TTL) passes. This waits on the lease's own clock, by design.
    let reason = tokio::time::timeout(Duration::from_secs(10), held.lost())
        .await
        .expect("reported within the TTL");
    assert!(matches!(reason, LossReason::Unrenewed { .. }), "{reason:?}");

    redis.restart(&binary);
    // The cell is created again from this instance's config; service resumes.
    let mut resumed = None;
    for attempt in 0..20 {
        match fleet
            .try_acquire(&LeaseRequest::new(
                format!("after{attempt}"),
                "t",
                "d",
                1,
                "upload",
            ))
            .await
        {
            Ok(lease) => {
                resumed = Some(lease);
                break;
            }
            // The connection manager reconnects in the background after the first failure.
            Err(AcquireError::Unavailable(_)) => tokio::task::yield_now().await,
            Err(other) => panic!("{other}"),
        }
        let _ = fleet.snapshot("t", "d").await;
    }
    let resumed = resumed.expect("service resumed after the restart");
    let max_before = *tokens.iter().max().expect("tokens");
    assert!(
        resumed.token().0 > max_before,
        "{} after {max_before}",
        resumed.token()
    );
    let snapshot = fleet.snapshot("t", "d").await.expect("snapshot");
    assert_eq!((snapshot.leases, snapshot.occupancy.service_bytes), (1, 1));
    drop(held);
    resumed.release(Outcome::Completed).await.expect("released");
}

#[tokio::test]
async fn an_evicting_server_is_refused_or_warned_about_as_configured() {
    let binary = redis_server_binary("eviction");
    let redis = PrivateRedis::start(
        &binary,
        &["--maxmemory-policy".into(), "allkeys-lru".into()],
    );
    let cfg = config(
        "127.0.0.1",
        redis.port,
        &cell("eviction"),
        ceilings(10, 1, 10, 1, 1),
    );
    match RedisAdmission::connect(cfg.clone()).await {
        Err(ConnectError::Eviction { policy }) => assert_eq!(policy, "allkeys-lru"),
        other => panic!("expected an eviction refusal, got {:?}", other.map(|_| ())),
    }
    let mut warn = cfg;
    warn.eviction_check = EvictionCheck::Warn;
    assert!(RedisAdmission::connect(warn).await.is_ok());
}

#[tokio::test]
async fn tls_with_a_self_signed_certificate_and_a_password() {
    let binary = redis_server_binary("tls");
    let dir = tempfile::tempdir().expect("tempdir");
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
        .expect("cert");
    let cert_pem = cert.cert.pem();
    let cert_file = dir.path().join("server.crt");
    let key_file = dir.path().join("server.key");
    std::fs::write(&cert_file, &cert_pem).expect("write cert");
    std::fs::write(&key_file, cert.signing_key.serialize_pem()).expect("write key");
    let password = "s3cret-Pa55";
    let redis = PrivateRedis::start(
        &binary,
        &[
            "--tls-cert-file".into(),
            cert_file.display().to_string(),
            "--tls-key-file".into(),
            key_file.display().to_string(),
            "--tls-ca-cert-file".into(),
            cert_file.display().to_string(),
            "--tls-auth-clients".into(),
            "no".into(),
            "--requirepass".into(),
            password.into(),
        ],
    );
    let cell = cell("tls");
    let mut cfg = config("127.0.0.1", redis.port, &cell, ceilings(10, 1, 10, 1, 1));
    cfg.password = Some(Secret::new(password));
    cfg.tls = Some(Tls {
        root_cert_pem: Some(cert_pem.into_bytes()),
        verify: true,
    });
    cfg.tenant_mode = Some(admission_redis::TenantMode {
        data_plane_cell: cell.clone(),
    });
    assert!(
        !format!("{cfg:?}").contains(password),
        "the config's Debug shows the password"
    );
    let fleet = connect(cfg.clone()).await;
    let lease = fleet
        .try_acquire(&LeaseRequest::new("over-tls", "t", "d", 1, "upload"))
        .await
        .expect("fits");
    lease.release(Outcome::Completed).await.expect("released");
    assert_eq!(read_events(&fleet).await.expect("events").len(), 2);

    // A wrong password is refused, and no error shows either password.
    let mut wrong = cfg.clone();
    wrong.password = Some(Secret::new("not-the-Pa55"));
    let error = RedisAdmission::connect(wrong).await.err().expect("refused");
    let text = format!("{error} {error:?}");
    assert!(
        !text.contains("not-the-Pa55") && !text.contains(password),
        "{text}"
    );
    // Without the certificate the server is not trusted.
    let mut untrusted = cfg;
    untrusted.tls = Some(Tls {
        root_cert_pem: None,
        verify: true,
    });
    assert!(matches!(
        RedisAdmission::connect(untrusted).await,
        Err(ConnectError::Unavailable(_))
    ));
}

/// The holder half of the crash test: runs only in the child process the test starts.
#[tokio::test]
#[ignore = "the child process of a_killed_holder_is_reaped_on_server_time"]
async fn holder_process() {
    let Ok(spec) = std::env::var("ADMISSION_REDIS_HOLDER") else {
        return;
    };
    let parts: Vec<&str> = spec.split(' ').collect();
    let (host, port, cell) = (parts[0], parts[1].parse().expect("port"), parts[2]);
    let fleet = connect(config(host, port, cell, ceilings(100, 2, 100, 2, 2))).await;
    let lease = fleet
        .try_acquire(&LeaseRequest::new("crashed", "t", "d", 40, "upload"))
        .await
        .expect("fits");
    println!("HELD {}", lease.token());
    let _held = lease;
    std::future::pending::<()>().await;
}

#[tokio::test]
async fn a_killed_holder_is_reaped_on_server_time() {
    let (host, port) = server("crash");
    let cell = cell("crash");
    let fleet = connect(config(&host, port, &cell, ceilings(100, 2, 100, 2, 2))).await;
    let spec = format!("{host} {port} {cell}");
    let (mut child, held) = child_process(
        "servers::holder_process",
        "ADMISSION_REDIS_HOLDER",
        &spec,
        "HELD ",
    );
    let token: u64 = held["HELD ".len()..].parse().expect("a token");
    // SIGKILL: no release, no drop, nothing runs in the holder.
    child.kill().expect("killed");
    child.wait().expect("reaped by the OS");
    let before = fleet.snapshot("t", "d").await.expect("snapshot");
    assert_eq!((before.leases, before.occupancy.service_bytes), (1, 40));
    // Past the 3 s TTL on the cell's clock, the next call reaps it.
    fleet
        .advance_server_clock(Duration::from_millis(3_001))
        .await
        .expect("skew");
    let after = fleet.snapshot("t", "d").await.expect("snapshot");
    assert_eq!((after.leases, after.reaped), (0, 1));
    assert_eq!(after.occupancy, Default::default());
    let expired = wait_for_event(&fleet, &host, port, "expired", "crashed").await;
    assert_eq!(
        (
            expired.token,
            expired.footprint,
            expired.occupancy.service_bytes
        ),
        (token, 40, 0)
    );
}
