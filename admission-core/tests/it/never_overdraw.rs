//! Random demand shapes over random gates and meters never overdraw an account, and every waiter
//! is granted in the end. And the monitor's shortcuts (an arrival asked at the line's tail, a
//! release's pass that stops early) grant, step by step, exactly whom full passes grant: the same
//! scenario runs on a monitor with a pass-through gate, which takes neither shortcut. Both
//! shortcuts were checked to fail this test when broken (an early stop at any head, an arrival
//! asked without the head's reservation).

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
        let monitor = Monitor::builder().manual_passes().clock(clock.shared()).build();
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
            let mut admit = Box::pin(monitor.admit(demand, &JobContext::new(format!("job{j}")), None));
            match poll_once(&mut admit) {
                Some(outcome) => grants.push(outcome.expect("every demand fits its accounts")),
                None => pending.push(admit),
            }
            check_never_overdrawn(&world, &grants);
        }
        let collect = |pending: &mut Vec<std::pin::Pin<Box<admission_core::Admit>>>, grants: &mut Vec<Grant>| {
            monitor.pass_now();
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

/// A gate that never holds anyone. Its only effect is to keep a monitor on the general path:
/// with a gate, every arrival rings for a full pass and a release's pass never stops early.
struct PassThrough;

impl admission_core::Gate for PassThrough {
    fn name(&self) -> &str {
        "pass-through"
    }
    fn category(&self) -> admission_core::Category {
        admission_core::Category::custom("pass_through")
    }
    fn check(&self, _view: admission_core::GateView) -> admission_core::GateAnswer {
        admission_core::GateAnswer::Pass
    }
    fn passed(&self, _view: admission_core::GateView) {}
    fn completed(&self) {}
    fn on_change(&self, _wake: Option<admission_core::WakeFn>) {}
}

/// One monitor and its own accounts, its own clock, its jobs' admits and grants (by job index).
struct Side {
    clock: FakeClock,
    monitor: Monitor,
    accounts: Vec<AccountRef>,
    pending: Vec<(usize, std::pin::Pin<Box<admission_core::Admit>>)>,
    grants: Vec<(usize, Grant)>,
}

impl Side {
    fn new(s: &Scenario, gated: bool) -> Side {
        let clock = FakeClock::new();
        let mut builder = Monitor::builder().manual_passes().clock(clock.shared());
        if gated {
            builder = builder.gate(Arc::new(PassThrough));
        }
        let accounts = s
            .gates
            .iter()
            .enumerate()
            .map(|(i, c)| Arc::new(Permits::new(format!("gate{i}"), *c)) as AccountRef)
            .chain(s.meters.iter().enumerate().map(|(i, (c, r))| {
                Arc::new(Meter::new(format!("meter{i}"), *c, *r, clock.shared())) as AccountRef
            }))
            .collect();
        Side {
            monitor: builder.build(),
            clock,
            accounts,
            pending: Vec::new(),
            grants: Vec::new(),
        }
    }

    fn arrive(&mut self, j: usize, job: &BTreeMap<usize, u64>) {
        let mut demand = Demand::new();
        for (&i, &amount) in job {
            demand.add(self.accounts[i].clone(), Amount::units(amount));
        }
        let mut admit = Box::pin(self.monitor.admit(
            demand,
            &JobContext::new(format!("job{j}")),
            None,
        ));
        match poll_once(&mut admit) {
            Some(outcome) => self.grants.push((j, outcome.expect("every demand fits"))),
            None => self.pending.push((j, admit)),
        }
    }

    /// Every outcome collected, after a full pass when `pass` (what the evaluator thread would
    /// run); the jobs granted so far, sorted.
    fn settle(&mut self, pass: bool) -> Vec<usize> {
        if pass {
            self.monitor.pass_now();
        }
        let mut pending = std::mem::take(&mut self.pending);
        pending.retain_mut(|(j, admit)| match poll_once(admit) {
            Some(outcome) => {
                self.grants.push((*j, outcome.expect("every demand fits")));
                false
            }
            None => true,
        });
        self.pending = pending;
        let mut granted: Vec<usize> = self.grants.iter().map(|(j, _)| *j).collect();
        granted.sort_unstable();
        granted
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    /// Asking an arrival at the line's tail and stopping a release's pass early grant exactly
    /// whom full passes grant, step by step: the shortcuts change the cost, never the answer.
    #[test]
    fn arrivals_and_early_stops_grant_exactly_what_full_passes_grant(s in scenario()) {
        let mut quick = Side::new(&s, false);
        let mut full = Side::new(&s, true);
        // No full pass on the quick side after an arrival or a release: what the arrival's own
        // ask and the release's own pass granted must already be what a full pass grants. The
        // gated side parks every arrival for the evaluator, whose pass is run here.
        for (j, job) in s.jobs.iter().enumerate() {
            quick.arrive(j, job);
            full.arrive(j, job);
            prop_assert_eq!(quick.settle(false), full.settle(true), "after job {} arrived", j);
        }
        for (n, release) in s.steps.iter().enumerate() {
            for side in [&mut quick, &mut full] {
                if *release {
                    // The oldest job holding a grant, the same job on both sides.
                    let oldest = side.grants.iter().enumerate().min_by_key(|(_, (j, _))| *j);
                    if let Some((at, _)) = oldest {
                        drop(side.grants.remove(at));
                    }
                } else {
                    side.clock.advance(Duration::from_secs(1));
                }
            }
            // Time passing is the evaluator's to notice, on both sides.
            let pass = !*release;
            prop_assert_eq!(quick.settle(pass), full.settle(pass), "after step {}", n);
        }
    }
}
