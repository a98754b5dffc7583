//! A config that cannot work is refused at construction, naming the field; the password never
//! renders. (No server needed.)

use std::time::Duration;

use admission_redis::{
    ConnectError, RedisAdmission, RedisAdmissionConfig, Secret, TenantMode, Tls,
};

use crate::support::ceilings;

fn valid() -> RedisAdmissionConfig {
    RedisAdmissionConfig::new("127.0.0.1", 1, "cell-1", ceilings(1000, 10, 500, 5, 8))
}

type Change = Box<dyn Fn(&mut RedisAdmissionConfig)>;

fn field_of(config: &RedisAdmissionConfig) -> &'static str {
    config.validate().expect_err("refused").field()
}

#[test]
fn the_defaults_are_valid() {
    assert_eq!(valid().validate(), Ok(()));
}

#[test]
fn each_unworkable_field_is_named() {
    let cases: Vec<(&str, Change)> = vec![
        (
            "lease_ttl",
            Box::new(|c| c.lease_ttl = Duration::from_millis(2_999)),
        ),
        (
            "renew_every",
            Box::new(|c| c.renew_every = Duration::from_millis(3_334)),
        ),
        ("renew_every", Box::new(|c| c.renew_every = Duration::ZERO)),
        (
            "ceilings.tenant_bytes",
            Box::new(|c| c.ceilings.tenant_bytes = 1001),
        ),
        (
            "ceilings.tenant_transfers",
            Box::new(|c| c.ceilings.tenant_transfers = 11),
        ),
        (
            "ceilings.backend_transfers",
            Box::new(|c| c.ceilings.backend_transfers = 11),
        ),
        (
            "ceilings.service_bytes",
            Box::new(|c| c.ceilings.service_bytes = 0),
        ),
        (
            "ceilings.service_bytes",
            Box::new(|c| c.ceilings.service_bytes = (1 << 53) + 1),
        ),
        (
            "key_prefix",
            Box::new(|c| c.key_prefix = "bad prefix".into()),
        ),
        ("key_prefix", Box::new(|c| c.key_prefix = "a{b}".into())),
        ("key_prefix", Box::new(|c| c.key_prefix = String::new())),
        ("key_prefix", Box::new(|c| c.key_prefix = "x".repeat(65))),
        ("cell", Box::new(|c| c.cell = "cell:1".into())),
        (
            "redis_wait",
            Box::new(|c| c.redis_wait = Duration::from_secs(31)),
        ),
        (
            "ceilings.service_bytes",
            Box::new(|c| {
                // Ten transfers cannot each hold a byte of nine.
                c.ceilings.service_bytes = 9;
                c.ceilings.tenant_bytes = 9;
            }),
        ),
        (
            "response_timeout",
            Box::new(|c| c.response_timeout = Duration::from_millis(2_001)),
        ),
        (
            "connect_timeout",
            Box::new(|c| c.connect_timeout = Duration::from_millis(2_001)),
        ),
        (
            "cell_idle_expiry",
            Box::new(|c| c.cell_idle_expiry = Duration::from_millis(59_999)),
        ),
        (
            "cell_idle_expiry",
            Box::new(|c| {
                c.lease_ttl = Duration::from_secs(40);
                c.cell_idle_expiry = Duration::from_millis(79_999);
            }),
        ),
        ("events_max_len", Box::new(|c| c.events_max_len = 0)),
        ("reap_batch", Box::new(|c| c.reap_batch = 0)),
        (
            "quotas.requests_per_minute",
            Box::new(|c| {
                c.quotas = Some(admission_redis::Quotas {
                    requests_per_minute: 0,
                    bytes_per_hour: 1,
                })
            }),
        ),
    ];
    for (field, change) in cases {
        let mut config = valid();
        change(&mut config);
        assert_eq!(field_of(&config), field, "{config:?}");
    }
    // At the boundaries, accepted: TTL 3 s renewed every 1 s; redis_wait equal to the timeout.
    let mut edge = valid();
    edge.lease_ttl = Duration::from_secs(3);
    edge.renew_every = Duration::from_secs(1);
    edge.redis_wait = edge.local_timeout;
    // A connection attempt and a response fill the renewal interval exactly.
    edge.connect_timeout = Duration::from_millis(500);
    edge.response_timeout = Duration::from_millis(500);
    // A cell that expires after a minute idle; ten transfers of a byte each.
    edge.cell_idle_expiry = Duration::from_secs(60);
    edge.ceilings.service_bytes = 10;
    edge.ceilings.tenant_bytes = 10;
    assert_eq!(edge.validate(), Ok(()));
    // The timeouts' message names all three figures.
    let mut slow = valid();
    slow.response_timeout = Duration::from_millis(2_500);
    assert_eq!(
        slow.validate().unwrap_err().to_string(),
        "admission-redis config: `response_timeout` connect_timeout 1s + response_timeout 2.5s = \
         3.5s is over renew_every 3s: a renewal that meets a dead connection must end before the \
         next is due"
    );
}

#[test]
fn tenant_mode_requires_tls_verification_authentication_and_the_same_cell() {
    let mut config = valid();
    config.tenant_mode = Some(TenantMode {
        data_plane_cell: "cell-1".into(),
    });
    assert_eq!(field_of(&config), "tls");
    config.tls = Some(Tls {
        root_cert_pem: None,
        verify: false,
    });
    assert_eq!(field_of(&config), "tls.verify");
    config.tls = Some(Tls {
        root_cert_pem: None,
        verify: true,
    });
    assert_eq!(field_of(&config), "password");
    config.password = Some(Secret::new("hunter2"));
    assert_eq!(config.validate(), Ok(()));
    config.tenant_mode = Some(TenantMode {
        data_plane_cell: "cell-2".into(),
    });
    let error = config.validate().unwrap_err();
    assert_eq!(error.field(), "tenant_mode.data_plane_cell");
    assert_eq!(
        error.to_string(),
        "admission-redis config: `tenant_mode.data_plane_cell` \"cell-2\" does not match the cell \"cell-1\""
    );
}

#[test]
fn the_password_never_renders() {
    let mut config = valid();
    config.password = Some(Secret::new("hunter2"));
    assert_eq!(format!("{}", Secret::new("hunter2")), "<redacted>");
    assert!(!format!("{config:?}").contains("hunter2"));
    assert!(format!("{config:?}").contains("<redacted>"));
}

#[tokio::test]
async fn connect_refuses_a_bad_config_before_touching_the_network() {
    let mut config = valid();
    config.lease_ttl = Duration::from_secs(1);
    match RedisAdmission::connect(config).await {
        Err(ConnectError::Config(error)) => {
            assert_eq!(error.field(), "lease_ttl");
            assert_eq!(
                error.to_string(),
                "admission-redis config: `lease_ttl` 1s is under the 3 s minimum"
            );
        }
        other => panic!("expected a config error, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn the_fingerprint_follows_the_shared_settings_only() {
    let a = valid();
    let mut b = valid();
    b.host = "elsewhere".into();
    b.renew_every = Duration::from_secs(2);
    b.redis_wait = Duration::from_secs(1);
    assert_eq!(a.fingerprint(), b.fingerprint());
    // The lease TTL is shared: a waiter's lease granted by another instance's release lives it.
    let mut c = valid();
    c.lease_ttl = Duration::from_secs(60);
    assert_ne!(a.fingerprint(), c.fingerprint());
    b.ceilings.service_transfers = 11;
    assert_ne!(a.fingerprint(), b.fingerprint());
}
