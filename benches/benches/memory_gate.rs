//! Criterion bench of what the memory gate adds to an uncontended admit: admit and release of a
//! one-entry demand on a monitor without a gate, beside the same with a GREEN [`MemoryGate`]
//! reading the test-kit's fake probe (the gate's own cost), and with the real resident-set probe
//! with its readings reused for nothing (`with_max_reading_age(0)`: the gate plus one read of
//! `/proc/self/status` per admit, since every uncontended admit is a fresh instant on the system
//! clock), and with that probe's default, readings reused for 5 ms.
//!
//! Read the medians as a difference: the gate's row minus `no_gate` is what the gate adds. Run
//! with `cargo bench -p admission-benches --bench memory_gate`.

use std::sync::Arc;
use std::time::Duration;

use admission_accounts::MemoryGate;
use admission_accounts::memory_gate::ManualProbe;
use admission_accounts::memory_gate::ResidentSetProbe;
use admission_benches::support::admit_release;
use admission_core::{AccountRef, Amount, Demand, JobContext, Monitor};
use admission_testkit::reference::Permits;
use criterion::{Criterion, criterion_group, criterion_main};

/// Permits nobody can exhaust.
const PLENTY: u64 = 1_000_000;

fn uncontended_gate(c: &mut Criterion) {
    let pool: AccountRef = Arc::new(Permits::new("pool", PLENTY));
    let demand = Demand::new().with(pool, Amount::ONE);
    let job = JobContext::new("bench");

    let plain = Monitor::new();
    let probe = ManualProbe::new();
    probe.set_percent(50);
    let green = Monitor::builder()
        .gate(Arc::new(MemoryGate::new(probe)))
        .build();
    let real = Monitor::builder()
        .gate(Arc::new(
            MemoryGate::new(ResidentSetProbe::new(1 << 40)).with_max_reading_age(Duration::ZERO),
        ))
        .build();

    let aged = Monitor::builder()
        .gate(Arc::new(
            // The probe's default age: 5 ms.
            MemoryGate::new(ResidentSetProbe::new(1 << 40)),
        ))
        .build();

    let mut group = c.benchmark_group("memory_gate_uncontended_one_limit");
    group.bench_function("no_gate", |b| {
        b.iter(|| admit_release(&plain, demand.clone(), &job))
    });
    group.bench_function("gate_green_fake_probe", |b| {
        b.iter(|| admit_release(&green, demand.clone(), &job))
    });
    group.bench_function("gate_green_resident_set_probe", |b| {
        b.iter(|| admit_release(&real, demand.clone(), &job))
    });
    group.bench_function("gate_green_resident_set_probe_5ms_age", |b| {
        b.iter(|| admit_release(&aged, demand.clone(), &job))
    });
    group.finish();
}

fn short() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(40)
}

criterion_group! {
    name = benches;
    config = short();
    targets = uncontended_gate
}
criterion_main!(benches);
