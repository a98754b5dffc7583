//! Fair shares through a real monitor: with capacities named, tenants share each scarce account in
//! its own units (a job's cost is its dominant share), where a sum of amounts in unrelated units
//! would charge a tenant of small token calls as if its gate permits were tokens.

use std::num::NonZeroU64;
use std::sync::Arc;

use admission_accounts::CountingGate;
use admission_core::{Amount, Demand, FairShares, JobContext, Monitor};
use admission_testkit::monitor::poll_once;

/// The order in which the jobs of `line` (name, tenant, permits of `db`, tokens of `model`) are
/// granted, each also asking the one permit of a gate that lets one job through at a time: all
/// park behind a holder, then each grant is dropped in turn.
fn served(shares: FairShares, line: &[(&'static str, &str, u64, u64)]) -> Vec<&'static str> {
    let monitor = Monitor::builder().fair_shares(shares).build();
    let clock = monitor.clock().clone();
    let one = Arc::new(CountingGate::new("one-at-a-time", 1, clock.clone()).expect("gate"));
    let db = Arc::new(CountingGate::new("db", 10, clock.clone()).expect("gate"));
    let model = Arc::new(CountingGate::new("model", 1_000, clock).expect("gate"));
    let demand = |permits: u64, tokens: u64| {
        let mut demand = Demand::new().with(one.clone(), Amount::ONE);
        if permits > 0 {
            demand = demand.with(db.clone(), Amount::units(permits));
        }
        if tokens > 0 {
            demand = demand.with(model.clone(), Amount::units(tokens));
        }
        demand
    };
    let holder = monitor
        .try_admit(&demand(0, 0), &JobContext::new("holder"))
        .expect("the line is empty")
        .into_owned();
    let mut parked: Vec<_> = line
        .iter()
        .map(|&(name, tenant, permits, tokens)| {
            let ctx = JobContext::new(name).with_tenant(tenant);
            (
                name,
                Some(monitor.admit(demand(permits, tokens), &ctx, None)),
            )
        })
        .collect();
    for (name, admit) in &mut parked {
        assert!(
            poll_once(admit.as_mut().expect("parked")).is_none(),
            "{name} waits behind the holder"
        );
    }
    let mut order = Vec::new();
    let mut held = Some(holder);
    while let Some(grant) = held.take() {
        drop(grant);
        for (name, slot) in &mut parked {
            if let Some(granted) = slot.as_mut().and_then(poll_once) {
                *slot = None;
                order.push(*name);
                held = Some(granted.expect("granted"));
            }
        }
    }
    assert!(parked.iter().all(|(_, slot)| slot.is_none()), "all served");
    order
}

#[test]
fn with_capacities_each_tenant_pays_its_dominant_share_not_a_sum_of_units() {
    // acme's calls take a database connection (1 of 10) and 10 tokens (of 1,000); globex's take
    // 100 tokens: a tenth of a whole share each, by their dominant account.
    let line = [
        ("a1", "acme", 1, 10),
        ("a2", "acme", 1, 10),
        ("a3", "acme", 1, 10),
        ("a4", "acme", 1, 10),
        ("g1", "globex", 0, 100),
        ("g2", "globex", 0, 100),
    ];
    let per = |n| NonZeroU64::new(n).expect("not 0");
    let dominant = FairShares::new()
        .capacity("db", per(10))
        .capacity("model", per(1_000));
    assert_eq!(
        served(dominant, &line),
        ["a1", "g1", "a2", "g2", "a3", "a4"]
    );
    // Summed, acme's call costs 11 and globex's 100: acme's backlog goes first.
    let summed = FairShares::new().scarce("db").scarce("model");
    assert_eq!(served(summed, &line), ["a1", "g1", "a2", "a3", "a4", "g2"]);
}
