//! Two tenants of weight 1:1 on one fleet cell, each from its own OS process, one keeping ten
//! times the other's requests waiting (issue 39's fleet row): Jain's index of the tokens the
//! cell granted each tenant per minute, in arrival order and with the cell's fair shares.
//!
//! The cell has rates of 12,000 tokens per minute (a simulated minute of one real second, the
//! cell's own `Rates::minute`) and no burst beyond them; every lease is 100 tokens, held 5 ms.
//! This process is tenant `acme` with 20 tasks (each asking again as soon as its lease is
//! released); a second process of this binary is tenant `globex` with 2. Each mode runs 14
//! minutes on its own cell of a private `redis-server`; the tokens per tenant and minute come
//! from the cell's own event stream (the `admitted` records, by the server's clock), minutes 3
//! to 12 counted (the first two spend the level the cell starts with, the last ones are the
//! processes stopping).
//!
//! Run with `cargo bench -p admission-benches --bench fleet_fairness` (needs `redis-server` on
//! PATH). Results are printed and written to `target/side-by-side/fleet_fairness.json`.

use std::process::{Command, Stdio};
use std::time::Duration;

use admission_benches::Results;
use admission_benches::fairness::jain;
use admission_benches::redis_server::RedisServer;
use admission_core::FairShares;
use admission_redis::{
    Ceilings, LeaseRequest, Outcome, Rates, RedisAdmission, RedisAdmissionConfig, hashed_id,
    read_events,
};

/// The environment variable that makes this binary the second process: `port cell fair`.
const CHILD: &str = "ADMISSION_FLEET_FAIRNESS_CHILD";
const MINUTE: Duration = Duration::from_secs(1);
const MINUTES: u64 = 14;
const COUNTED: std::ops::Range<u64> = 2..12;
const TOKENS: u64 = 100;
const HOLD: Duration = Duration::from_millis(5);

fn config(port: u16, cell: &str, fair: bool) -> RedisAdmissionConfig {
    let ceilings = Ceilings {
        service_bytes: 1 << 20,
        service_transfers: 64,
        tenant_bytes: 1 << 20,
        tenant_transfers: 64,
        backend_transfers: 64,
    };
    let mut config = RedisAdmissionConfig::new("127.0.0.1", port, cell, ceilings);
    config.rates = Some(Rates {
        tokens_per_minute: 12_000,
        requests_per_minute: 100_000,
        minute: MINUTE,
        burst: None,
    });
    config.redis_wait = Duration::from_secs(30);
    config.events_max_len = 1_000_000;
    // Each mode's cell is new on a private server: nothing to recover.
    config.recover_created_cells = false;
    if fair {
        config.fair_shares = Some(FairShares::new());
    }
    config
}

/// `tasks` tasks of `tenant`, each asking for a lease, holding it `HOLD` and asking again, for
/// `MINUTES` minutes.
async fn run_tenant(port: u16, cell: &str, fair: bool, tenant: &'static str, tasks: usize) {
    let fleet = RedisAdmission::connect(config(port, cell, fair))
        .await
        .expect("connects");
    let end = tokio::time::Instant::now() + MINUTE * MINUTES as u32;
    let mut handles = Vec::new();
    for task in 0..tasks {
        let fleet = fleet.clone();
        handles.push(tokio::spawn(async move {
            let mut n = 0u64;
            while tokio::time::Instant::now() < end {
                n += 1;
                let request = LeaseRequest::new(
                    format!("{tenant}-{task}-{n}"),
                    tenant,
                    "model",
                    TOKENS,
                    "call",
                );
                let Ok(lease) = fleet.acquire(&request, Duration::from_secs(30)).await else {
                    continue;
                };
                tokio::time::sleep(HOLD).await;
                let _ = lease.release(Outcome::Completed).await;
            }
        }));
    }
    for handle in handles {
        let _ = handle.await;
    }
}

/// Tokens granted to `acme` and `globex` in each counted minute, from the cell's events.
async fn per_minute(port: u16, cell: &str, fair: bool) -> Vec<[f64; 2]> {
    let fleet = RedisAdmission::connect(config(port, cell, fair))
        .await
        .expect("connects");
    let events = read_events(&fleet).await.expect("events");
    let (acme, globex) = (hashed_id("acme"), hashed_id("globex"));
    let admitted: Vec<_> = events.iter().filter(|e| e.kind == "admitted").collect();
    let start = admitted.first().map_or(0, |e| e.time_ms);
    let mut minutes = vec![[0.0; 2]; (COUNTED.end - COUNTED.start) as usize];
    for e in admitted {
        let minute = (e.time_ms - start) / MINUTE.as_millis() as u64;
        if !COUNTED.contains(&minute) {
            continue;
        }
        let tenant = if e.tenant == acme {
            0
        } else if e.tenant == globex {
            1
        } else {
            continue;
        };
        minutes[(minute - COUNTED.start) as usize][tenant] += e.footprint as f64;
    }
    minutes
}

/// One mode: the second process started, this one's tasks run, the minutes read.
async fn mode(port: u16, fair: bool) -> Vec<[f64; 2]> {
    let cell = if fair { "fleet-fair" } else { "fleet-arrival" };
    let mut child = Command::new(std::env::current_exe().expect("this binary"))
        .env(CHILD, format!("{port} {cell} {fair}"))
        .stdout(Stdio::null())
        .spawn()
        .expect("the second process");
    run_tenant(port, cell, fair, "acme", 20).await;
    let status = child.wait().expect("the second process ends");
    assert!(status.success(), "the second process failed: {status}");
    per_minute(port, cell, fair).await
}

fn summary(name: &str, minutes: &[[f64; 2]], results: Results) -> Results {
    let per_minute: Vec<f64> = minutes.iter().map(|m| jain(m)).collect();
    let mean = per_minute.iter().sum::<f64>() / per_minute.len() as f64;
    let least = per_minute.iter().copied().fold(f64::INFINITY, f64::min);
    let totals = [
        minutes.iter().map(|m| m[0]).sum::<f64>(),
        minutes.iter().map(|m| m[1]).sum::<f64>(),
    ];
    let share = totals[0] / (totals[0] + totals[1]);
    println!(
        "{name:>8}: Jain per minute mean {mean:.3}, least {least:.3}; acme's share {share:.3} \
         of {} tokens over {} minutes",
        totals[0] + totals[1],
        minutes.len()
    );
    results
        .number(&format!("{name}_jain_mean"), mean)
        .number(&format!("{name}_jain_least"), least)
        .number(&format!("{name}_acme_share"), share)
        .number(&format!("{name}_tokens"), totals[0] + totals[1])
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    if let Ok(spec) = std::env::var(CHILD) {
        let parts: Vec<&str> = spec.split(' ').collect();
        let port = parts[0].parse().expect("port");
        let (cell, fair) = (parts[1].to_owned(), parts[2] == "true");
        runtime.block_on(run_tenant(port, &cell, fair, "globex", 2));
        return;
    }
    let server = RedisServer::start();
    runtime.block_on(async {
        let arrival = mode(server.port, false).await;
        let fair = mode(server.port, true).await;
        let results = summary("arrival", &arrival, Results::new("fleet_fairness"));
        let results = summary("fair", &fair, results);
        match results.write() {
            Ok(path) => println!("wrote {}", path.display()),
            Err(error) => eprintln!("could not write results: {error}"),
        }
    });
}
