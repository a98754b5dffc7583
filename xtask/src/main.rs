//! `cargo xtask`: the workspace's one entry point for checks. `cargo xtask ci` runs everything CI
//! runs, in the order CI runs it; `.ci/run` only installs the tools and then calls it.
//!
//! Every step is a cargo command run from the workspace root with `$CARGO` (or, for `chaos` and
//! `public items`, this xtask's own command as a process of its own); its command line is echoed as
//! `==> [i/n] name: command`, it is timed, and the first failure stops the run with a message
//! naming the step. A summary of the steps' times follows, and a successful run that ran tests
//! ends with the single line `xtask: N passed, 0 failed`, which CI's log reader looks for.
//! Dependencies stay few: `anyhow`, `serde_json` (to read bench results, cargo's build messages
//! and the agents fleet's member reports), `public-api` (to list a crate's public items from its
//! rustdoc JSON) and the standard library.

mod bench;
mod chaos;
mod count;
mod levels;
mod load;
mod lock_bench;
mod paths;
mod public_items;
mod services;
mod step;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};

use count::Format;
use step::{Step, Workspace};

const USAGE: &str = "\
usage: cargo xtask <command> [args]

commands:
  ci                       everything CI runs, in order, stopping at the first failure:
                             1 fmt        cargo fmt --all -- --check
                             2 levels     cargo xtask levels (below; reads the sources, no build)
                             3 clippy     cargo clippy --workspace --all-targets FEATURES -- -D warnings
                             4 tests      cargo nextest run --workspace FEATURES --profile services
                                          --no-fail-fast --test-threads 4
                             5 doc tests  cargo test --workspace --doc FEATURES
                             6 memcheck   the core's tests of step 4 under valgrind (below)
                             7 paths      cargo xtask paths (below; the example step 4 built)
                             8 docs       cargo doc --workspace --no-deps FEATURES with RUSTDOCFLAGS='-D warnings'
                             9 public items  cargo xtask public-items (below; step 8's build again,
                                          rustdoc writing JSON)
                            10 release build  cargo build --release --workspace --bench '*' --examples
                                          (the benches compiled, not run; the examples for 11 to 13)
                            11 agents     target/release/examples/agents --time-scale 300 --check
                            12 agents fleet  the same as a fleet: --fleet 4 --time-scale 60
                                          --fleet-rates both --check
                                          (four processes on a private redis-server, which must be on
                                          PATH; a simulated minute of one real second, so that a few
                                          milliseconds of lag between a grant and its call stay small
                                          beside the minute the provider counts over)
                            13 chaos      cargo xtask chaos (below)
                            14 loom       cargo test -p admission-core --lib --release -- loom
                                          with RUSTFLAGS='--cfg admission_loom',
                                          LOOM_MAX_PREEMPTIONS=2 (unless set), CARGO_TARGET_DIR=target/loom
                           Steps 3 to 9 share one dev build and one check of the dependencies (one
                           feature set, FEATURES, one target dir); 10 to 13 one release build.
  test [-p CRATE]... [FILTER]...
                           steps 4 and 5 for the packages chosen (all of them by default), their
                           tests chosen by FILTER (test names, as nextest reads them), with only
                           the servers those packages need up (admission-redis: Redis and the
                           Redis Cluster; admission-tower: Redis; admission-db: PostgreSQL); the
                           same build as ci's, so once built one crate's tests start in seconds
  loom                     step 14
  memcheck                 admission-core's unit and integration tests (the soak at 20,000
                           admissions), the binaries step 4 built, each run whole under
                           valgrind's memcheck (valgrind must be on PATH; `.ci/run` installs it):
                           any read of freed or uninitialized memory (the core has no unsafe code
                           of its own; its dependencies' and the standard library's is exercised)
                           fails the step (exit 99)
  public-items [--bless]   each library crate's public items (rustdoc JSON on stable, rendered by
                           public-api) against public-items/CRATE.txt: fails on any added or
                           removed line; --bless rewrites the lists, to commit with the change
  chaos                    the agents fleet through six real faults and two signals to its
                           parent, one run each (about 70 s once the example is built; each run
                           bounded): agents --fleet 4 --time-scale 300 --admit-timeout 3600
                           --check --chaos FAULT for FAULT = restart (its private redis-server
                           SIGKILLed 1 s in and started again on its port 2 s later),
                           restart-fsync (the same, the server fsyncing every write and the
                           cells told so), pause (CLIENT PAUSE 3000), kill-member (one member
                           SIGKILLed), kill-master (on a private six-node Redis Cluster, the
                           master serving the first model's cell SIGKILLed) and failover
                           (CLUSTER FAILOVER to that master's replica, the cells waiting for one
                           replica), each failing when admission did not resume within the
                           fault's bound (restart: 10 to 11 s after the new process started;
                           restart-fsync: 0.5 s after the server was back; pause: 0.5 s after
                           it ended; kill-member: 1 s after the kill; kill-master: 11 s after
                           the cluster was ok again; failover: 1 s after the new master
                           answered), on a job that failed unless its own deadline fell
                           between the fault and that resumption (any, after restart-fsync or
                           failover, and any recovery there), a ceiling exceeded, or anything
                           still held in Redis; then the same without --chaos, its parent sent
                           a signal 1.5 s after its `== fleet:` line: term-parent (on a
                           redis-server of the run's own, --redis; SIGTERM: the parent must
                           forward it and exit within 20 s with its tables, 4 of 4 processes
                           reported and a verdict that fails only for the signal, no member
                           left, nothing held in Redis: redis-cli finds every cell's exp, line
                           and live empty, occ without st, sb, r: or q:) and kill-parent (on
                           the parent's own private redis-server; SIGKILL: every member must
                           exit within 10 s and write its report, and the private server must
                           be gone within 5 s and its directory removed)
  soak [N]                 the core soak test at N admissions (default 1,000,000) in release:
                           threads and tasks, cancellations, 1 ms timeouts, abandoned futures;
                           prints the tally, fails on any overdraw, hang or leaked unit
  levels                   admission-core's files in four levels (the table LEVELS in
                           xtask/src/levels.rs: vocabulary and contract, synchronization, the
                           state machine, the shell), read with syn, test code included; fails on
                           an import from a higher level (`use`, `crate::`/`super::` paths, through
                           re-exports), a type whose impls are at different levels, and a circle
                           of files; prints the table and `levels: N upward imports, N circles, N
                           split impls`
  paths                    the admission-core files whose code runs on a parked admit_blocking and
                           on the release that wakes it, measured under callgrind on the
                           test-kit's `paths` example (the account's own `ask` not counted), in
                           the order they run and the files re-entered (returns); fails
                           when ARCHITECTURE.md's `<!-- paths: ... -->` marker lists others
  bench [--all] [--report-only] [args...]
                           the side-by-side benchmarks: cargo bench -p admission-benches
                           --bench side_by_side --bench scarce_and_wakes [args...] (--all: every
                           bench, cargo bench -p admission-benches [args...]), then rewrites the table
                           between the side-by-side markers in BENCHMARKS.md from
                           target/criterion and target/side-by-side (--report-only: no run);
                           its header names the machine's mode, fast or slow, by tokio's
                           try_acquire_many(1) + drop measured in the same run
  lock-bench [--runs N] [--rounds R]
                           the monitor's lock, parking_lot's (the default) against std's: builds
                           the bench monitor_lock of admission-benches twice (as it is, and with
                           RUSTFLAGS adding --cfg admission_monitor_lock=\"std\"; into
                           target/lock-bench/parking_lot and target/lock-bench/std), runs the two
                           alternately N times each (default 5) on the contended rows (64 tasks x
                           R admits on 8 permits, R = 10,000) and the uncontended gate row, and
                           prints each lock's median wall time, CPU time (getrusage, user +
                           system) and voluntary / involuntary context switches, and std's over
                           parking_lot's (not part of ci)
  load [SECONDS] [--exe PATH]
                           the axum example (or the build at PATH) under wrk (which must be on
                           PATH: apt-get install wrk) at 8, 64 and 256 connections for SECONDS
                           each (default 20), without and with its line bound: answers,
                           goodput, refusal and success latencies, and the requests refused only
                           after waiting their whole timeout (not part of ci)
  with-services -- CMD...  run CMD with Redis, a six-node Redis Cluster and PostgreSQL up
                           (ADMISSION_REDIS_URL, ADMISSION_REDIS_CLUSTER, ADMISSION_PG_URL)
  help                     this text

FEATURES is `--features admission-db/r2d2-sqlite,admission-db/r2d2-postgres,
admission-db/deadpool-postgres,admission-db/sqlx-sqlite,admission-db/sqlx-postgres,
admission-db/contract,admission-db/metrics,admission-redis/tls,admission-redis/metrics,
admission-redis/test-util,admission-tower/http,admission-tower/grpc,admission-tower/fleet,
admission-events/metrics,admission-core/test-util,admission-llm/test-util,
admission-testkit/redis-servers`: every feature of the library crates (the database providers,
their contract suite and their pool metrics, the Redis provider's TLS, metrics and test clock,
the tower layer's HTTP and gRPC refusal mappings and its fleet quotas, the metrics sink, the
test hooks, the private Redis servers), which no default build compiles.

The test steps run with the services listed in xtask/src/services.rs up: Redis
(ADMISSION_REDIS_URL) and a Redis Cluster of three masters and three replicas
(ADMISSION_REDIS_CLUSTER, its nodes comma separated) for admission-redis, and PostgreSQL
(ADMISSION_PG_URL) for admission-db's PostgreSQL tests, through nextest's `services` profile
(.config/nextest.toml). A plain `cargo nextest run` leaves the tests that need a server out and
reports them skipped; run alone without its server, such a test fails.";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("xtask: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &[String]) -> Result<ExitCode> {
    let (command, rest) = match args.split_first() {
        Some((command, rest)) => (command.as_str(), rest),
        None => ("help", &[][..]),
    };
    let takes_no_args = |name: &str| -> Result<()> {
        if rest.is_empty() {
            Ok(())
        } else {
            bail!("`{name}` takes no arguments, got {rest:?}")
        }
    };
    let ws = Workspace::locate()?;
    match command {
        "ci" => {
            takes_no_args("ci")?;
            // Before the first step: a machine that lacks a service's package learns it now
            // (or gets it installed), not after clippy.
            services::ensure_installed(services::REQUIRED)?;
            let mut steps = vec![
                Step::cargo("fmt", &["fmt", "--all", "--", "--check"]),
                // Reads the sources only (no build): admission-core's files in their levels.
                levels::step(),
                Step::cargo(
                    "clippy",
                    &with_features(
                        &["clippy", "--workspace", "--all-targets"],
                        &["--", "-D", "warnings"],
                    ),
                ),
            ];
            steps.extend(test_steps(&ws, &Selection::default())?);
            steps.push(memcheck_step()?);
            // The tests step built the example already (same features): seconds under callgrind.
            steps.push(paths::step());
            steps.push(Step::cargo("docs", &docs_args()).env("RUSTDOCFLAGS", "-D warnings"));
            steps.push(Step::xtask("public items", &["public-items"]));
            // One release build for the benches (compiled, not run) and the examples, which the
            // next three steps run: nothing is built twice.
            steps.push(Step::cargo("release build", RELEASE_BUILD));
            let agents = chaos::release_dir(&ws)?.join("examples").join("agents");
            steps.push(Step::program("agents", agents.clone(), AGENTS_CHECK));
            steps.push(Step::program("agents fleet", agents, AGENTS_FLEET_CHECK));
            steps.push(Step::xtask("chaos", &["chaos"]));
            steps.push(loom_step()?);
            run_plan(&ws, &steps)
        }
        "test" => {
            let selection = Selection::parse(rest)?;
            run_plan(&ws, &test_steps(&ws, &selection)?)
        }
        "loom" => {
            takes_no_args("loom")?;
            run_plan(&ws, &[loom_step()?])
        }
        "memcheck" => {
            takes_no_args("memcheck")?;
            memcheck(&ws)
        }
        "chaos" => {
            takes_no_args("chaos")?;
            chaos::run(&ws)
        }
        "public-items" => public_items::run(&ws, rest),
        "soak" => {
            let admits = match rest {
                [] => "1000000".to_string(),
                [n] if n.parse::<u64>().is_ok_and(|n| n > 0) => n.clone(),
                _ => bail!("usage: cargo xtask soak [ADMISSIONS]"),
            };
            run_plan(&ws, &[soak_step(admits)])
        }
        "bench" => bench::run(&ws, rest),
        "levels" => levels::run(&ws, rest),
        "paths" => paths::run(&ws, rest),
        "lock-bench" => lock_bench::run(&ws, rest),
        "load" => load::run(&ws, rest),
        "with-services" => with_services(&ws, rest),
        "help" | "-h" | "--help" => {
            println!("{USAGE}");
            Ok(ExitCode::SUCCESS)
        }
        other => {
            eprintln!("xtask: unknown command `{other}`\n\n{USAGE}");
            Ok(ExitCode::from(2))
        }
    }
}

/// The release build the benches, the examples and the chaos step share: every bench target
/// (compiled, not run) and every example of the workspace, in one resolution of the features.
/// (Not `--benches`, which would build each library's unit benches too, with its dev-dependencies:
/// admission-redis's own turns on its test clock, which the agents must not run with.)
pub(crate) const RELEASE_BUILD: &[&str] = &[
    "build",
    "--release",
    "--workspace",
    "--bench",
    "*",
    "--examples",
];

/// The agents example (from [`RELEASE_BUILD`]), run short (400 agents, one simulated minute per
/// 0.2 s, about 3 s) with `--check`: it fails unless nothing went over capacity, every job
/// finished and nothing was held afterwards.
const AGENTS_CHECK: &[&str] = &["--time-scale", "300", "--check"];

/// The agents example as a fleet, run short: two processes sharing one Redis cell per model on a
/// private `redis-server` the example starts and stops, and one provider over HTTP the parent
/// serves, once with the models' rates in the cells and once without (`--fleet-rates both`,
/// about 8 s), with `--check`: it also fails on any fleet-wide occupancy over a ceiling, a lease
/// lost, or a lease still held afterwards.
const AGENTS_FLEET_CHECK: &[&str] = &[
    "--fleet",
    "4",
    "--time-scale",
    "60",
    "--fleet-rates",
    "both",
    "--check",
];

/// Runs `steps`; a plan that ran tests ends with the line CI's log reader looks for.
fn run_plan(ws: &Workspace, steps: &[Step]) -> Result<ExitCode> {
    let report = step::run_plan(ws, steps)?;
    if report.ran_tests {
        if report.skipped > 0 {
            // Ignored tests (the child processes that a crash test runs itself) and, outside
            // the services profile, the tests that need a server.
            println!("xtask: {} skipped", report.skipped);
        }
        println!("xtask: {} passed, 0 failed", report.passed);
    }
    Ok(ExitCode::SUCCESS)
}

/// The features the checks turn on beyond the defaults: the database providers and their
/// contract suite (`admission-db`), the Redis provider's TLS, metrics and test clock
/// (`admission-redis`), the tower layer's refusal mappings and fleet quotas (`admission-tower`)
/// and the metrics sink (`admission-events`), which nothing in the workspace enables by default.
const FEATURES: &[&str] = &[
    "--features",
    "admission-db/r2d2-sqlite,admission-db/r2d2-postgres,admission-db/deadpool-postgres,\
     admission-db/sqlx-sqlite,admission-db/sqlx-postgres,admission-db/contract,\
     admission-db/metrics,admission-redis/tls,admission-redis/metrics,admission-redis/test-util,\
     admission-tower/http,admission-tower/grpc,admission-tower/fleet,admission-events/metrics,\
     admission-core/test-util,admission-llm/test-util,admission-testkit/redis-servers,\
     admission-accounts/tokio",
];

/// The docs step's arguments (`cargo doc --workspace --no-deps FEATURES`), which the public
/// items step repeats with rustdoc's JSON output, so that both reuse one check of the
/// dependencies.
pub(crate) fn docs_args() -> Vec<&'static str> {
    with_features(&["doc", "--workspace", "--no-deps"], &[])
}

/// The servers a package's tests need (`services.rs`); none for the others.
fn services_for(package: &str) -> &'static [services::Service] {
    use services::Service::{Postgres, Redis, RedisCluster};
    match package {
        "admission-redis" => &[Redis, RedisCluster],
        "admission-tower" => &[Redis],
        "admission-db" => &[Postgres],
        _ => &[],
    }
}

/// What `cargo xtask test` runs: the packages chosen (none: all of them) and the test name
/// filters passed to the runner.
#[derive(Debug, Default, PartialEq, Eq)]
struct Selection {
    packages: Vec<String>,
    filters: Vec<String>,
}

impl Selection {
    /// `[-p CRATE]... [FILTER]...`.
    fn parse(args: &[String]) -> Result<Selection> {
        let mut selection = Selection::default();
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "-p" | "--package" => match args.next() {
                    Some(package) => selection.packages.push(package.clone()),
                    None => bail!("usage: cargo xtask test [-p CRATE]... [FILTER]..."),
                },
                flag if flag.starts_with('-') => {
                    bail!("`test` takes -p CRATE and test name filters, not {flag:?}")
                }
                filter => selection.filters.push(filter.to_owned()),
            }
        }
        Ok(selection)
    }

    /// The servers the chosen packages' tests need: every service when none is chosen.
    fn services(&self) -> Vec<services::Service> {
        if self.packages.is_empty() {
            return services::REQUIRED.to_vec();
        }
        let mut needed = Vec::new();
        for service in self.packages.iter().flat_map(|p| services_for(p)) {
            if !needed.contains(service) {
                needed.push(*service);
            }
        }
        needed
    }

    /// A nextest filter expression for the chosen packages (`None`: every package).
    fn expression(&self) -> Option<String> {
        (!self.packages.is_empty()).then(|| {
            self.packages
                .iter()
                .map(|p| format!("package({p})"))
                .collect::<Vec<_>>()
                .join(" | ")
        })
    }
}

/// `before`, then [`FEATURES`], then `after`: one cargo command's arguments.
fn with_features<'a>(before: &[&'a str], after: &[&'a str]) -> Vec<&'a str> {
    [before, FEATURES, after].concat()
}

/// Tests (nextest, which skips doc tests; its `services` profile runs the tests that need a
/// server too) and then doc tests, with the servers the chosen packages need up. One build for
/// any selection: the packages are chosen by a filter over the whole workspace, with FEATURES,
/// so a selection reuses what `ci` built and the other way round.
fn test_steps(ws: &Workspace, selection: &Selection) -> Result<Vec<Step>> {
    if !ws.has_nextest() {
        bail!(
            "the test steps run cargo-nextest, which is not installed: cargo install \
             cargo-nextest --locked (`.ci/run` installs it)"
        );
    }
    let services = selection.services();
    let mut args = with_features(
        &["nextest", "run", "--workspace", "--profile", "services"],
        &["--no-fail-fast", "--test-threads", TEST_THREADS],
    );
    let expression = selection.expression();
    if let Some(expression) = &expression {
        args.extend(["-E", expression.as_str()]);
    }
    args.extend(selection.filters.iter().map(String::as_str));
    let mut steps = vec![
        Step::cargo("tests", &args)
            .counting_tests(Format::Nextest)
            .with_services(&services),
    ];
    // The doc tests of the packages chosen (all of them when none is). A selection passes only
    // its packages' own features: cargo refuses another package's.
    let members = ws.members()?;
    let chosen: Vec<&String> = members
        .iter()
        .filter(|m| selection.packages.is_empty() || selection.packages.contains(m))
        .collect();
    let own_features = selection_features(&selection.packages);
    if !chosen.is_empty() {
        let mut doc_args = if selection.packages.is_empty() {
            with_features(&["test", "--workspace", "--doc"], &[])
        } else {
            let mut args = vec!["test", "--doc"];
            for package in &chosen {
                args.extend(["-p", package.as_str()]);
            }
            if !own_features.is_empty() {
                args.extend(["--features", own_features.as_str()]);
            }
            args
        };
        if !selection.filters.is_empty() {
            doc_args.push("--");
            doc_args.extend(selection.filters.iter().map(String::as_str));
        }
        steps.push(
            Step::cargo("doc tests", &doc_args)
                .counting_tests(Format::Libtest)
                .with_services(&services),
        );
    }
    Ok(steps)
}

/// The entries of FEATURES that belong to `packages`, comma separated.
fn selection_features(packages: &[String]) -> String {
    FEATURES[1]
        .split(',')
        .filter(|feature| {
            feature
                .split_once('/')
                .is_some_and(|(package, _)| packages.iter().any(|p| p == package))
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Tests run at once by the tests step: twice the cores of the machines CI runs on, since most
/// of the tests that take long wait on a server or a timer rather than the CPU.
const TEST_THREADS: &str = "4";

/// The loom models in `admission-core/src/monitor/loom_models.rs`, built in their own target dir
/// because the extra `--cfg` would otherwise rebuild the normal one. Zero matching tests pass.
fn loom_step() -> Result<Step> {
    let rustflags = match std::env::var("RUSTFLAGS") {
        Ok(flags) if !flags.trim().is_empty() => format!("{flags} --cfg admission_loom"),
        _ => "--cfg admission_loom".to_string(),
    };
    let preemptions = std::env::var("LOOM_MAX_PREEMPTIONS").unwrap_or_else(|_| "2".to_string());
    let target_dir = match std::env::var_os("CARGO_TARGET_DIR") {
        // Cargo reads a relative CARGO_TARGET_DIR against the current directory; the steps run
        // from the workspace root, so make it absolute first.
        Some(dir) => absolute(Path::new(&dir))?
            .join("loom")
            .to_string_lossy()
            .into_owned(),
        None => "target/loom".to_string(),
    };
    Ok(Step::cargo(
        "loom",
        &[
            "test",
            "-p",
            "admission-core",
            "--lib",
            "--release",
            "--",
            "loom",
        ],
    )
    .env("RUSTFLAGS", rustflags)
    .env("LOOM_MAX_PREEMPTIONS", preemptions)
    .env("CARGO_TARGET_DIR", target_dir)
    .counting_tests(Format::Libtest))
}

/// `admission-core`'s unit and integration tests under valgrind's memcheck (`cargo xtask
/// memcheck`, [`memcheck`]), counted as libtest reports them.
fn memcheck_step() -> Result<Step> {
    if !services::binary_found("valgrind") {
        bail!(
            "the memcheck step needs valgrind, which is not on PATH: install it \
             (sudo apt-get install -y valgrind) and run again"
        );
    }
    Ok(Step::xtask("memcheck", &["memcheck"]).counting_tests(Format::Libtest))
}

/// `cargo xtask memcheck`: `admission-core`'s unit and integration test binaries, from the
/// tests step's own build (`cargo test --workspace FEATURES --no-run` finds them built: nothing is
/// built again), each run whole as `valgrind --error-exitcode=99 --leak-check=no --quiet BINARY
/// --test-threads 2` (one valgrind per binary, not per test). The soak runs at 20,000
/// admissions (about a minute under valgrind). Memcheck exits 99 on the first invalid read or
/// write; leaks are not its question here.
fn memcheck(ws: &Workspace) -> Result<ExitCode> {
    let args = with_features(
        &["test", "--workspace", "--no-run"],
        &["--message-format=json-render-diagnostics"],
    );
    let output = Command::new(&ws.cargo)
        .args(&args)
        .current_dir(&ws.root)
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("could not run cargo test --no-run")?;
    if !output.status.success() {
        bail!("cargo {} failed ({})", args.join(" "), output.status);
    }
    let binaries = core_test_binaries(&String::from_utf8_lossy(&output.stdout));
    if binaries.len() != 2 {
        bail!("expected admission-core's lib and `it` test binaries, found {binaries:?}");
    }
    for binary in binaries {
        println!("==> memcheck: {}", binary.display());
        let status = Command::new("valgrind")
            .args(["--error-exitcode=99", "--leak-check=no", "--quiet"])
            .arg(&binary)
            .args(["--test-threads", "2"])
            .current_dir(&ws.root)
            .env("ADMISSION_SOAK_ADMITS", "20000")
            // Valgrind runs the code tens of times slower: a test that holds a bound on time (the
            // statement's two seconds for a pass over 10,000 waiters) checks it in the tests
            // step, not here.
            .env("ADMISSION_UNDER_VALGRIND", "1")
            .status()
            .context("could not run valgrind")?;
        if !status.success() {
            bail!("{} under valgrind: {status}", binary.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The test executables of `admission-core`'s library and of its `it` integration tests, from
/// cargo's JSON messages.
fn core_test_binaries(messages: &str) -> Vec<PathBuf> {
    messages
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| {
            m["reason"] == "compiler-artifact"
                && m["profile"]["test"] == true
                && m["package_id"]
                    .as_str()
                    .is_some_and(|id| id.contains("admission-core"))
                && (m["target"]["kind"][0] == "lib"
                    || (m["target"]["kind"][0] == "test" && m["target"]["name"] == "it"))
        })
        .filter_map(|m| m["executable"].as_str().map(PathBuf::from))
        .collect()
}

/// The core soak test (`admission-core/tests/it/soak.rs`) at `admits` admissions, in release,
/// printing its tally. CI runs it at its default 24,000 with the other tests.
fn soak_step(admits: String) -> Step {
    Step::cargo(
        "soak",
        &[
            "test",
            "-p",
            "admission-core",
            "--release",
            "--test",
            "it",
            "--",
            "soak",
            "--nocapture",
        ],
    )
    .env("ADMISSION_SOAK_ADMITS", admits)
    .counting_tests(Format::Libtest)
}

fn absolute(path: &Path) -> Result<PathBuf> {
    std::path::absolute(path).with_context(|| format!("could not resolve {}", path.display()))
}

/// `cargo xtask with-services -- CMD ARGS...`: every known service up around one command, which
/// runs from the current directory with the services' URLs in its environment.
fn with_services(ws: &Workspace, args: &[String]) -> Result<ExitCode> {
    let args = args.strip_prefix(&["--".to_string()]).unwrap_or(args);
    let Some((program, program_args)) = args.split_first() else {
        bail!("usage: cargo xtask with-services -- CMD [ARGS...]");
    };
    let running = services::start(services::ALL)?;
    let program: OsString = if program == "cargo" {
        ws.cargo.clone()
    } else {
        program.into()
    };
    let status = Command::new(&program)
        .args(program_args)
        .envs(running.env())
        .status()
        .with_context(|| format!("could not run {program:?}"));
    running.stop()?;
    let status = status?;
    println!("==> with-services: {program:?} exited with {status}");
    Ok(match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        None => ExitCode::FAILURE,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use services::Service::{Postgres, Redis, RedisCluster};

    fn args(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn a_selection_names_its_packages_and_filters() {
        let selection = Selection::parse(&args(&[
            "-p",
            "admission-redis",
            "recovery",
            "--package",
            "admission-db",
        ]))
        .unwrap();
        assert_eq!(selection.packages, ["admission-redis", "admission-db"]);
        assert_eq!(selection.filters, ["recovery"]);
        assert_eq!(
            selection.expression().as_deref(),
            Some("package(admission-redis) | package(admission-db)")
        );
        assert!(Selection::parse(&args(&["-p"])).is_err());
        assert!(Selection::parse(&args(&["--release"])).is_err());
    }

    #[test]
    fn a_selection_starts_only_the_servers_its_packages_need() {
        let of = |packages: &[&str]| {
            Selection {
                packages: args(packages),
                filters: Vec::new(),
            }
            .services()
        };
        assert_eq!(of(&[]), services::REQUIRED);
        assert_eq!(of(&["admission-core"]), []);
        assert_eq!(of(&["admission-redis"]), [Redis, RedisCluster]);
        assert_eq!(of(&["admission-tower", "admission-db"]), [Redis, Postgres]);
        assert_eq!(
            of(&["admission-redis", "admission-tower"]),
            [Redis, RedisCluster]
        );
    }

    #[test]
    fn the_cores_lib_and_it_test_binaries_are_read_from_cargos_messages() {
        let message = |package: &str, kind: &str, name: &str, test: bool, exe: &str| {
            serde_json::json!({
                "reason": "compiler-artifact",
                "package_id": format!("path+file:///w/{package}#0.1.0"),
                "target": { "kind": [kind], "name": name },
                "profile": { "test": test },
                "executable": exe,
            })
            .to_string()
        };
        let messages = [
            message(
                "admission-core",
                "lib",
                "admission_core",
                true,
                "/t/core-lib",
            ),
            message(
                "admission-core",
                "lib",
                "admission_core",
                false,
                "/t/not-a-test",
            ),
            message("admission-core", "test", "it", true, "/t/core-it"),
            message("admission-core", "test", "hand_off_heap", true, "/t/heap"),
            message("admission-accounts", "test", "it", true, "/t/accounts-it"),
        ]
        .join("\n");
        assert_eq!(
            core_test_binaries(&messages),
            [PathBuf::from("/t/core-lib"), PathBuf::from("/t/core-it")]
        );
    }

    #[test]
    fn a_selection_passes_only_its_own_features() {
        assert_eq!(
            selection_features(&args(&["admission-tower"])),
            "admission-tower/http,admission-tower/grpc,admission-tower/fleet"
        );
        assert_eq!(
            selection_features(&args(&["admission-accounts"])),
            "admission-accounts/tokio"
        );
        assert_eq!(selection_features(&args(&["xtask"])), "");
    }
}
