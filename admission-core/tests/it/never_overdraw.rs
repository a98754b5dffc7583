//! Random demand shapes over random gates and meters never overdraw an account, and every waiter
//! is granted in the end.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use admission_core::{AccountRef, Amount, Demand, Grant, JobContext, Monitor};
use admission_testkit::FakeClock;
use admission_testkit::monitor::poll_once;
use admission_testkit::reference::{Meter, Permits};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Scenario {
    gates: Vec<u64>,
    meters: Vec<(u64, u64)>,
    /// Per job: account index -> amount (indices past the gates are meters).
    jobs: Vec<BTreeMap<usize, u64>>,
    /// Per step: release the oldest grant (true) or advance the clock one second (false).
    steps: Vec<bool>,
}

fn scenario() -> impl Strategy<Value = Scenario> {
    (
        prop::collection::vec(1u64..=4, 1..=3),
        prop::collection::vec((1u64..=8, 1u64..=4), 0..=2),
    )
        .prop_flat_map(|(gates, meters)| {
            let caps: Vec<u64> = gates
                .iter()
                .copied()
                .chain(meters.iter().map(|m| m.0))
                .collect();
            let n = caps.len();
            let job = prop::collection::btree_map(0..n, 1u64..=8, 0..=3).prop_map(move |m| {
                m.into_iter()
                    .map(|(i, a)| (i, a.min(caps[i])))
                    .collect::<BTreeMap<_, _>>()
            });
            (
                Just(gates),
                Just(meters),
                prop::collection::vec(job, 1..=24),
                prop::collection::vec(any::<bool>(), 0..=40),
            )
        })
        .prop_map(|(gates, meters, jobs, steps)| Scenario {
            gates,
            meters,
            jobs,
            steps,
        })
}

struct World {
    gates: Vec<Arc<Permits>>,
    meters: Vec<Arc<Meter>>,
    meter_caps: Vec<u64>,
    accounts: Vec<AccountRef>,
}

fn check_never_overdrawn(world: &World, grants: &[Grant]) {
    for (g, gate) in world.gates.iter().enumerate() {
        let held: u64 = grants
            .iter()
            .map(|grant| {
                grant
                    .entries()
                    .iter()
                    .filter(|e| Arc::ptr_eq(e.account(), &world.accounts[g]))
                    .map(|e| e.amount().primary())
                    .sum::<u64>()
            })
            .sum();
        assert_eq!(
            gate.in_use(),
            held,
            "gate {g}: in use differs from what grants hold"
        );
        assert!(gate.in_use() <= gate.capacity(), "gate {g} overdrawn");
    }
    for (meter, cap) in world.meters.iter().zip(&world.meter_caps) {
        assert!(
            meter.level() <= *cap,
            "a meter holds more than its capacity"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, .. ProptestConfig::default() })]

    #[test]
    fn random_demands_never_overdraw_and_every_waiter_is_granted(s in scenario()) {
        let clock = FakeClock::new();
        let monitor = Monitor::builder().clock(clock.shared()).build();
        let gates: Vec<Arc<Permits>> = s.gates.iter().enumerate()
            .map(|(i, c)| Arc::new(Permits::new(format!("gate{i}"), *c))).collect();
        let meters: Vec<Arc<Meter>> = s.meters.iter().enumerate()
            .map(|(i, (c, r))| Arc::new(Meter::new(format!("meter{i}"), *c, *r, clock.shared()))).collect();
        let accounts: Vec<AccountRef> = gates.iter().map(|g| g.clone() as AccountRef)
            .chain(meters.iter().map(|m| m.clone() as AccountRef)).collect();
        let meter_caps = s.meters.iter().map(|m| m.0).collect();
        let world = World { gates, meters, meter_caps, accounts };

        let mut pending = Vec::new();
        let mut grants: Vec<Grant> = Vec::new();
        for (j, job) in s.jobs.iter().enumerate() {
            let mut demand = Demand::new();
            for (&i, &amount) in job {
                demand.add(world.accounts[i].clone(), Amount::units(amount));
            }
            let mut admit = monitor.admit(demand, &JobContext::new(format!("job{j}")), None);
            match poll_once(&mut admit) {
                Some(outcome) => grants.push(outcome.expect("every demand fits its accounts")),
                None => pending.push(admit),
            }
            check_never_overdrawn(&world, &grants);
        }
        let collect = |pending: &mut Vec<admission_core::Admit>, grants: &mut Vec<Grant>| {
            monitor.evaluate_once();
            pending.retain_mut(|admit| match poll_once(admit) {
                Some(outcome) => { grants.push(outcome.expect("every demand fits")); false }
                None => true,
            });
        };
        for release in &s.steps {
            if *release {
                if !grants.is_empty() { drop(grants.remove(0)); }
            } else {
                clock.advance(Duration::from_secs(1));
            }
            collect(&mut pending, &mut grants);
            check_never_overdrawn(&world, &grants);
        }
        // Drain: release everything and let time refill the meters, until the line is empty.
        let mut rounds = 0;
        while !pending.is_empty() {
            rounds += 1;
            prop_assert!(rounds <= 4 * s.jobs.len() + 10, "waiters starved: {} left", pending.len());
            grants.clear();
            clock.advance(Duration::from_secs(10));
            collect(&mut pending, &mut grants);
            check_never_overdrawn(&world, &grants);
        }
        prop_assert_eq!(monitor.queue_size(), 0);
        grants.clear();
        for gate in &world.gates {
            prop_assert_eq!(gate.in_use(), 0, "a permit leaked");
        }
    }
}
