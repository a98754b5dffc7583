//! The README's fleet example, run as it is written against the server `cargo xtask ci` starts,
//! with the default config; and a check that the README still shows it as it runs here.

use std::time::Duration;

use admission_redis::{Ceilings, LeaseRequest, Outcome, RedisAdmission, RedisAdmissionConfig};

use crate::support::server;

#[rustfmt::skip] // the README's layout
// README begin
/// A new deployment's first fleet lease, with the defaults.
async fn first_lease(host: &str, port: u16) -> Result<(), Box<dyn std::error::Error>> {
    let ceilings = Ceilings {
        service_bytes: 8 << 30, service_transfers: 256,   // the whole fleet
        tenant_bytes: 2 << 30, tenant_transfers: 64,      // each tenant (live overrides possible)
        backend_transfers: 128,                           // each storage backend
    };
    let config = RedisAdmissionConfig::new(host, port, "uploads", ceilings);
    let fleet = RedisAdmission::connect(config).await?;
    // A new cell admits at once, unless the server started less than a lease TTL (10 s) ago:
    // it may have restarted empty, so the cell first waits out what it may have lost.
    let request = LeaseRequest::new("upload-7f3a", "tenant-42", "disk-a", 128 << 20, "upload");
    let lease = fleet.acquire(&request, Duration::from_secs(15)).await?;
    // Write the payload, passing lease.token() to the store (fencing); watch lease.lost().
    lease.release(Outcome::Completed).await?;
    Ok(())
}
// README end

#[tokio::test]
async fn the_readme_fleet_example_runs_with_the_defaults() {
    let (host, port) = server("readme_fleet");
    first_lease(&host, port)
        .await
        .expect("the README's first lease is granted");
    // It left nothing held.
    let ceilings = Ceilings {
        service_bytes: 8 << 30,
        service_transfers: 256,
        tenant_bytes: 2 << 30,
        tenant_transfers: 64,
        backend_transfers: 128,
    };
    let fleet =
        RedisAdmission::connect(RedisAdmissionConfig::new(&host, port, "uploads", ceilings))
            .await
            .expect("connects");
    let snapshot = fleet
        .snapshot("tenant-42", "disk-a")
        .await
        .expect("snapshot");
    assert_eq!(snapshot.leases, 0);
    let kinds: Vec<String> = admission_redis::read_events(&fleet)
        .await
        .expect("events")
        .into_iter()
        .filter(|e| e.lease == "upload-7f3a")
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds, ["admitted", "completed"]);
}

#[test]
fn the_readme_shows_the_example_as_it_runs() {
    let this = include_str!("readme.rs");
    let begin = this.find("// README begin\n").expect("begin") + "// README begin\n".len();
    let end = this[begin..].find("// README end").expect("end") + begin;
    let example = &this[begin..end];
    let readme = include_str!("../../../README.md");
    assert!(
        readme.contains(example),
        "README.md's fleet example differs from tests/it/readme.rs:\n{example}"
    );
}
