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

/// What becomes of tenant acme's one-permit job on `model` (5 permits) parked behind globex's
/// job asking all 5, itself behind acme's head that waits for `db` and asks 1 of `model`, once
/// `model`'s 5 come back: (whether acme's job was granted then, `model`'s free permits then,
/// whether it was granted once globex's job gave up). `shares` `None`: arrival order.
fn small_job_behind_a_short_one(shares: Option<FairShares>) -> (bool, u64, bool) {
    let builder = Monitor::builder();
    let monitor = match shares {
        Some(shares) => builder.fair_shares(shares),
        None => builder,
    }
    .build();
    let clock = monitor.clock().clone();
    let db = Arc::new(CountingGate::new("db", 1, clock.clone()).expect("gate"));
    let model = Arc::new(CountingGate::new("model", 5, clock).expect("gate"));
    let acme = |name: &str| JobContext::new(name).with_tenant("acme");
    let holds = |gate: &Arc<CountingGate>, permits: u64| {
        let demand = Demand::new().with(gate.clone(), Amount::units(permits));
        monitor
            .try_admit(&demand, &acme("holder"))
            .expect("the line is empty")
            .into_owned()
    };
    let (_db_held, model_held) = (holds(&db, 1), holds(&model, 5));
    let head = Demand::new()
        .with(db.clone(), Amount::ONE)
        .with(model.clone(), Amount::ONE);
    let mut head = monitor.admit(head, &acme("head"), None);
    let all = Demand::new().with(model.clone(), Amount::units(5));
    let mut globex = Some(monitor.admit(all, &JobContext::new("g").with_tenant("globex"), None));
    let one = Demand::new().with(model.clone(), Amount::ONE);
    let mut small = monitor.admit(one, &acme("small"), None);
    assert!(poll_once(&mut head).is_none(), "the head waits for db");
    assert!(poll_once(globex.as_mut().expect("parked")).is_none());
    assert!(poll_once(&mut small).is_none(), "model is all held");

    drop(model_held);
    let at_release = poll_once(&mut small).map(|granted| granted.expect("granted"));
    let free = model.available();
    assert!(
        poll_once(globex.as_mut().expect("parked")).is_none(),
        "globex's 5 never fit beside the head's 1"
    );
    drop(globex.take());
    let granted = at_release.is_some() || poll_once(&mut small).is_some();
    assert!(
        poll_once(&mut head).is_none(),
        "the head still waits for db"
    );
    (at_release.is_some(), free, granted)
}

#[test]
fn a_waiter_short_on_a_scarce_account_keeps_its_turn_there() {
    // In arrival order acme's small job backfills beside the head's 1 at once, taking 1 of the 5
    // globex's earlier job waits for.
    assert_eq!(small_job_behind_a_short_one(None), (true, 4, true));
    // Under fair shares with model scarce, acme's job leaves globex's 5 aside as well as the
    // head's 1: it waits, all 5 stay free, and it goes the moment globex's job gives up.
    let scarce = FairShares::new().scarce("model");
    assert_eq!(small_job_behind_a_short_one(Some(scarce)), (false, 5, true));
    // A turn is kept only on accounts the cost counts: with db the scarce one, acme's job
    // backfills as in arrival order.
    let db_only = FairShares::new().scarce("db");
    assert_eq!(small_job_behind_a_short_one(Some(db_only)), (true, 4, true));
}
