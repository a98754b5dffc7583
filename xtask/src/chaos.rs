//! `cargo xtask chaos`: the agents fleet through six real faults and two signals to its parent,
//! one run each.
//!
//! # Faults
//!
//! Each fault run is `agents --fleet 4 --time-scale 300 --admit-timeout 3600 --check --chaos
//! FAULT` (see `examples/agents/chaos.rs`): the fleet's parent injects the fault itself, one
//! second of real time after its members started, on its private `redis-server` (for
//! `kill-master` and `failover`, on a private six-node Redis Cluster it starts and stops itself,
//! `admission_testkit::redis_servers`), so the fault lands at the same point of every run and is
//! over in bounded time. Each run is judged on its availability, on the example's own clock:
//!
//! | fault           | what the parent does                                       | first admission after it (`chaos: resumed:`)                    |
//! |-----------------|------------------------------------------------------------|-----------------------------------------------------------------|
//! | `restart`       | SIGKILLs the server, starts it again on its port 2 s later | 10 s (one lease TTL: the cells recover) to 11 s after the new   |
//! |                 | (an append-only file fsynced every second; cells declare   | process was spawned                                             |
//! |                 | nothing of it)                                             |                                                                 |
//! | `restart-fsync` | the same on a server run `--appendfsync always`, which the | at most 0.5 s after the server was ready again; 0 jobs failed,  |
//! |                 | cells declare (`Durability::fsync_always`)                 | no `recovering` record                                          |
//! | `pause`         | sends `CLIENT PAUSE 3000`                                  | at most 0.5 s after the pause ended                             |
//! | `kill-member`   | SIGKILLs the last member (its leases are held until their  | at most 1 s after the kill, by another member                   |
//! |                 | TTL)                                                       |                                                                 |
//! | `kill-master`   | SIGKILLs the cluster master serving the first model's cell | on its cells, no earlier than one TTL after the kill and at     |
//! |                 | (a replica takes over in about 2.5 s; its cells recover)   | most 11 s after the cluster was ok again                        |
//! | `failover`      | `CLUSTER FAILOVER` to that master's replica, every cell    | on its cells, at most 1 s after the new master answered; 0 jobs |
//! |                 | declaring one replica (`Durability::replicas`, `WAIT 1`)   | failed, no `recovering` record                                  |
//!
//! A run passes when it prints `check: passed` and exits 0 (every job ended, none failed but
//! those whose own deadline fell between the fault and the first admission after it, admission
//! resumed within the bound above, no ceiling was exceeded by the members' own count, nothing was
//! held in Redis at the end), and when the xtask reads the same from its lines: a `chaos:
//! resumed:` line whose first admission is within its bound and whose bound is the fault's own
//! ([`BOUNDS`]: a run that never resumes, or that loosened its bound, fails), a `chaos: jobs
//! failed:` line, and after a lossless fault (`restart-fsync`, `failover`) 0 jobs failed and
//! `chaos: recovery: none`. A lease wait lasts 12 s of real time (`--admit-timeout 3600` at the
//! scale of 300), longer than the pause (3 s) and the 10 s TTL of a killed member's leases: a job
//! waiting through one has time left after it. A lossy restart or failover stops admission on
//! the cells it reached for one TTL after the loss, so jobs whose wait ended in it fail, excused
//! (about 40 % of them after a `restart`, 30 % after a `kill-master`: the run prints the share).
//!
//! # Signals to the parent
//!
//! Two more runs check what the parent promises about signals (`examples/agents/signals.rs`):
//! forwarded SIGTERM/SIGINT stop its members, which release their leases and report, and the
//! parent still prints its table and verdict; a parent that dies, SIGKILL included, closes its
//! members' stdin pipes and they stop the same way, and the private `redis-server` it started
//! dies with it (its watchdog, `admission_testkit::redis_servers::PrivateServer`) and its directory is
//! removed. Each is `agents --fleet 4 --time-scale 300 --admit-timeout 3600 --check`: the
//! `term-parent` run against a `redis-server` this step starts for the run and stops after it
//! (`--redis 127.0.0.1:PORT`, [`services`]), so that the cells can still be read once the parent
//! is gone; the `kill-parent` run on the parent's own private server, whose pid, port and
//! directory it prints (`private redis-server: pid N, port P, directory D`). The xtask waits for
//! the parent's `== fleet:` line (printed once its cells exist, just before it starts its
//! members; at most [`STARTUP_LIMIT`]) and for its 4 members to be running (at most
//! [`MEMBERS_WITHIN`] after that line), and sends the signal [`SIGNAL_AFTER`] (1.5 s) after that
//! line, mid-run (a run is about 4 s without a signal):
//!
//! | run           | signal  | passes when                                                     |
//! |---------------|---------|-----------------------------------------------------------------|
//! | `term-parent` | SIGTERM | the parent says it forwarded SIGTERM and exits within [`TERM_EXIT_LIMIT`] (20 s), having printed both tables, `(4 of 4 processes reported`, and a verdict whose every `check:` line is the signal's own (below); no member is left running once it exited; nothing is held in Redis |
//! | `kill-parent` | SIGKILL | every member exits within [`MEMBER_EXIT_LIMIT`] (10 s) of the signal, each having written its report line (in `<out>/fleet/member-I.out`), at least one of them interrupted (so the closed pipe, not the end of the work, stopped it); the private `redis-server` is gone within [`SERVER_GONE_LIMIT`] (5 s) of the signal and its directory removed |
//!
//! A run stopped mid-way cannot pass the parent's `--check`: it exits 1 with `check: FAILED:`
//! lines. Those are the signal's own, and no failure of the fleet, when each is one of: the run
//! was stopped by SIGTERM, a member was interrupted by the forwarded SIGTERM, or a member's jobs
//! were cancelled (by it). Any other (a ceiling exceeded, a lease lost or still held, a member
//! that did not stop, exited badly or did not report, a job that timed out or failed) fails the
//! run, as does any exit status but 1 with such lines (or 0 with `check: passed`).
//!
//! "Nothing held" is read from the server with `redis-cli` once the members are gone: every cell
//! on it (the tag before the last `:` of its keys `...:cfg`, `...:occ`, `...:exp`, ...; at least
//! one must be found) has its `exp` sorted set (lease -> expiry) and its `line` and `live` sorted
//! sets (waiting tickets) empty or absent, and its `occ` hash has its counters `st` (transfers
//! in flight) and `sb` (bytes in flight) at 0 or absent and no lease record (`r:<id>`) or waiter
//! record (`q:<id>`). A member is found by its command line in `/proc`: `--fleet-member`, the
//! run's `--redis` endpoint (a fresh port each run) and an argument under the run's out
//! directory; a process is gone when `/proc` has no entry for it or it is a zombie. That is
//! Linux's: elsewhere no member is found and the signal runs fail.
//!
//! # Bounds
//!
//! Every run is made and its verdict printed even when an earlier one failed; the step fails if
//! any did. The example is built once (`cargo build --release --example agents`) and its binary
//! run directly, so that a run can be stopped by its own pid: a fault run that outlives
//! [`RUN_LIMIT`] gets SIGTERM (the parent forwards it to its members, which give their leases
//! back, and still prints its verdict), then SIGKILL after [`STOP_GRACE`]; a signal run's parent
//! or members still running at their bound are SIGKILLed by pid and the run fails. The eight
//! runs take about 70 s on a 2-core machine once the example is built (`restart` about 14 s,
//! `restart-fsync` 5 s, `pause` 6 s, `kill-member` 12 to 14 s (it reads the cells once the
//! killed member's leases reached their TTL), `kill-master` 16 to 18 s and `failover` 5 s, each
//! cluster run 2 s of it to start and join the cluster, `term-parent` 2 s and `kill-parent` 5 s:
//! its members stop about 3 s after the parent's death); [`RUN_LIMIT`] and
//! [`STOP_GRACE`] bound a fault run at 45 s (a cluster run's parent SIGTERMed stops its
//! cluster's nodes on its way out), and the bounds above a signal run at about a minute
//! (`term-parent`) or 40 s (`kill-parent`), which only a run that hangs reaches.

use std::collections::BTreeSet;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::services::{self, Service};
use crate::step::Workspace;

/// The faults, in the order they run.
pub(crate) const FAULTS: [&str; 6] = [
    "restart",
    "restart-fsync",
    "pause",
    "kill-member",
    "kill-master",
    "failover",
];

/// What each fault's `chaos: resumed:` line must say: the latest first admission its rule
/// allows, in milliseconds after the fault's reference instant (`examples/agents/chaos.rs`), the
/// earliest when the rule fixes one (a lossy restart's recovery: one lease TTL, 10 s), and
/// whether it loses nothing acknowledged (then no job may fail and no cell recover).
pub(crate) const BOUNDS: [Bound; 6] = [
    Bound::new("restart", Some(10_000), 11_000, false),
    Bound::new("restart-fsync", None, 500, true),
    Bound::new("pause", None, 500, false),
    Bound::new("kill-member", None, 1_000, false),
    Bound::new("kill-master", None, 11_000, false),
    Bound::new("failover", None, 1_000, true),
];

/// One fault's bound (see [`BOUNDS`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Bound {
    fault: &'static str,
    /// The earliest the first admission may come, ms after the reference, if the rule fixes it.
    earliest_ms: Option<u64>,
    /// The latest, ms after the reference.
    latest_ms: u64,
    /// No job may fail and no cell may recover.
    lossless: bool,
}

impl Bound {
    const fn new(
        fault: &'static str,
        earliest_ms: Option<u64>,
        latest_ms: u64,
        lossless: bool,
    ) -> Bound {
        Bound {
            fault,
            earliest_ms,
            latest_ms,
            lossless,
        }
    }

    /// The bound of `fault`.
    fn of(fault: &str) -> Option<Bound> {
        BOUNDS.iter().copied().find(|b| b.fault == fault)
    }

    /// What is wrong with a run's verdict against this bound (empty when nothing).
    fn judge(&self, verdict: &Verdict) -> Vec<String> {
        let mut wrong = Vec::new();
        match &verdict.resumed {
            None => wrong
                .push("no `chaos: resumed:` line: when admission resumed is unknown".to_owned()),
            Some(resumed) => {
                let (earliest, latest) = resumed.bound_ms;
                if latest != self.latest_ms || self.earliest_ms.is_some_and(|e| e != earliest) {
                    wrong.push(format!(
                        "the run's bound is {earliest} to {latest} ms, not the {}'s {}{} ms",
                        self.fault,
                        self.earliest_ms
                            .map_or_else(String::new, |e| format!("{e} to ")),
                        self.latest_ms
                    ));
                }
                match resumed.after_ms {
                    None => wrong.push("admission never resumed after the fault".to_owned()),
                    Some(after) if after < earliest || after > latest => wrong.push(format!(
                        "the first admission came {after} ms after the reference, outside {earliest} to {latest} ms"
                    )),
                    Some(_) if !resumed.ok => {
                        wrong.push("the run judged its resumption FAILED".to_owned());
                    }
                    Some(_) => {}
                }
            }
        }
        match verdict.jobs {
            None => wrong.push("no `chaos: jobs failed:` line".to_owned()),
            Some((failed, _)) if self.lossless && failed > 0 => wrong.push(format!(
                "{failed} jobs failed through a fault that loses nothing acknowledged"
            )),
            Some(_) => {}
        }
        if self.lossless && verdict.recovered != Some(false) {
            wrong.push(
                "no `chaos: recovery: none` line after a fault that loses nothing acknowledged"
                    .to_owned(),
            );
        }
        wrong
    }
}

/// The signal runs, after the faults: each one's name and the signal its parent gets.
const SIGNAL_RUNS: [SignalRun; 2] = [
    SignalRun {
        name: "term-parent",
        signal: "TERM",
        private: false,
    },
    SignalRun {
        name: "kill-parent",
        signal: "KILL",
        private: true,
    },
];

/// The fleet's processes, as [`RUN_ARGS`] asks for them.
const FLEET: u32 = 4;

/// Every run's flags (before `--chaos FAULT` or `--redis HOST:PORT`): four processes, a
/// simulated minute in 0.2 s (a run is about 4 s without a fault), lease waits of 12 s real, and
/// members cancelled after 25 s of real time whatever happens.
const RUN_ARGS: &[&str] = &[
    "--fleet",
    "4",
    "--time-scale",
    "300",
    "--admit-timeout",
    "3600",
    "--check",
    "--run-timeout",
    "25",
];

/// A run still going after this long is sent SIGTERM.
const RUN_LIMIT: Duration = Duration::from_secs(35);
/// After that SIGTERM, how long it has to print its verdict before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// A signal run: how long its parent has to print its `== fleet:` line.
const STARTUP_LIMIT: Duration = Duration::from_secs(15);
/// How long after that line all its members must be seen running.
const MEMBERS_WITHIN: Duration = Duration::from_secs(5);
/// When the parent gets its signal, after that line.
const SIGNAL_AFTER: Duration = Duration::from_millis(1_500);
/// How long a SIGTERMed parent has to stop its members, print its table and verdict, and exit.
const TERM_EXIT_LIMIT: Duration = Duration::from_secs(20);
/// How long the members of a SIGKILLed parent have to exit (and of a SIGTERMed parent that had
/// to be killed, before they are killed too).
const MEMBER_EXIT_LIMIT: Duration = Duration::from_secs(10);
/// How long the rest of a parent's output may take to arrive once it exited.
const OUTPUT_DRAIN: Duration = Duration::from_secs(5);
/// How long after a SIGKILLed parent its private redis-server may still run and its directory
/// still exist (its watchdog kills it at once; the directory's guard retries for up to 5 s).
const SERVER_GONE_LIMIT: Duration = Duration::from_secs(5);

/// What starts the parent's line about its private redis-server (`examples/agents/multi.rs`,
/// `PRIVATE_SERVER_PREFIX`).
const PRIVATE_SERVER_PREFIX: &str = "private redis-server: ";

/// What starts a member's report line (`examples/agents/multi.rs`, `REPORT_PREFIX`).
const REPORT_PREFIX: &str = "fleet-member-report: ";
/// The keys of a cell, after its tag (`admission-redis/src/script.rs`).
const CELL_KEYS: [&str; 8] = [
    "cfg", "occ", "exp", "events", "quota", "line", "live", "fair",
];

/// What one run printed and how it ended.
#[derive(Debug, Default, PartialEq, Eq)]
struct Verdict {
    /// `chaos: ...` lines: the failed jobs judged against the resumption, after a failover the
    /// election's time, the first admission after the fault against its bound, the recoveries.
    chaos: Vec<String>,
    /// `check: ...` lines: the verdict.
    check: Vec<String>,
    /// The `chaos: resumed:` line, read.
    resumed: Option<Resumed>,
    /// The `chaos: jobs failed: F of N` line, read: F and N.
    jobs: Option<(u64, u64)>,
    /// The `chaos: recovery:` line, read: whether a cell recovered after the fault.
    recovered: Option<bool>,
}

/// A `chaos: resumed:` line: `first admission[ on the failed-over cells] A ms after REFERENCE,
/// bound E to L ms: ok|FAILED (...)`, or `no admission[...] after REFERENCE, bound E to L ms:
/// FAILED`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Resumed {
    /// A: the first admission, ms after the reference; `None` when there was none.
    after_ms: Option<u64>,
    /// E and L.
    bound_ms: (u64, u64),
    /// Whether the run judged it `ok`.
    ok: bool,
}

impl Resumed {
    fn parse(line: &str) -> Option<Resumed> {
        let rest = line.strip_prefix("chaos: resumed: ")?;
        let (what, bound) = rest.split_once(", bound ")?;
        let after_ms = if what.starts_with("first admission") {
            let (before, _) = what.split_once(" ms after ")?;
            Some(before.rsplit(' ').next()?.parse().ok()?)
        } else if what.starts_with("no admission") {
            None
        } else {
            return None;
        };
        let (earliest, rest) = bound.split_once(" to ")?;
        let (latest, rest) = rest.split_once(" ms: ")?;
        Some(Resumed {
            after_ms,
            bound_ms: (earliest.parse().ok()?, latest.parse().ok()?),
            ok: rest.starts_with("ok"),
        })
    }
}

/// `chaos: jobs failed: F of N ...`: F and N.
fn jobs_failed(line: &str) -> Option<(u64, u64)> {
    let rest = line.strip_prefix("chaos: jobs failed: ")?;
    let mut words = rest.split_whitespace();
    let failed = words.next()?.parse().ok()?;
    (words.next()? == "of").then_some(())?;
    Some((failed, words.next()?.parse().ok()?))
}

impl Verdict {
    /// Keeps `line` if it is part of the verdict.
    fn observe(&mut self, line: &str) {
        let line = line.trim_end();
        if [
            "chaos: jobs failed:",
            "chaos: FAILED",
            "chaos: election:",
            "chaos: resumed:",
            "chaos: recovery:",
        ]
        .iter()
        .any(|prefix| line.starts_with(prefix))
        {
            self.chaos.push(line.to_owned());
            if line.starts_with("chaos: resumed:") {
                self.resumed = Resumed::parse(line);
            } else if let Some(jobs) = jobs_failed(line) {
                self.jobs = Some(jobs);
            } else if let Some(rest) = line.strip_prefix("chaos: recovery: ") {
                self.recovered = Some(!rest.starts_with("none"));
            }
        } else if line.starts_with("check: ") {
            self.check.push(line.to_owned());
        }
    }

    /// Whether the run said it passed, and only that.
    fn passed(&self) -> bool {
        matches!(self.check.as_slice(), [only] if only.starts_with("check: passed"))
    }
}

/// One run's line in the summary, and what is printed under it.
struct Outcome {
    name: String,
    seconds: f64,
    passed: bool,
    lines: Vec<String>,
}

/// Runs the four faults and the two signal runs; fails unless every run passed.
pub(crate) fn run(ws: &Workspace) -> Result<ExitCode> {
    let started = Instant::now();
    let exe = build_agents(ws)?;
    let target = exe
        .ancestors()
        .nth(3)
        .map_or_else(|| ws.root.join("target"), Path::to_path_buf);
    let runs = FAULTS.len() + SIGNAL_RUNS.len();
    let mut outcomes = Vec::new();
    for (index, fault) in FAULTS.iter().enumerate() {
        let out_dir = target.join("agents").join("chaos").join(fault);
        let mut args: Vec<String> = RUN_ARGS.iter().map(|a| a.to_string()).collect();
        args.extend(["--chaos".to_owned(), fault.to_string()]);
        args.extend(["--out-dir".to_owned(), out_dir.display().to_string()]);
        println!(
            "==> chaos [{}/{runs}] {fault}: {} {}",
            index + 1,
            exe.display(),
            args.join(" ")
        );
        let _ = std::io::stdout().flush();
        let run_started = Instant::now();
        let (ok, verdict) = run_one(&exe, &args, &ws.root)?;
        let mut lines: Vec<String> = verdict
            .chaos
            .iter()
            .chain(&verdict.check)
            .cloned()
            .collect();
        if verdict.check.is_empty() {
            lines.push("(no verdict printed)".to_owned());
        }
        let wrong = Bound::of(fault).map_or_else(
            || vec![format!("no bound is known for {fault}")],
            |bound| bound.judge(&verdict),
        );
        lines.extend(wrong.iter().map(|w| format!("FAILED (xtask): {w}")));
        outcomes.push(Outcome {
            name: fault.to_string(),
            seconds: run_started.elapsed().as_secs_f64(),
            passed: ok && verdict.passed() && wrong.is_empty(),
            lines,
        });
    }
    for (index, signal_run) in SIGNAL_RUNS.iter().enumerate() {
        let out_dir = target.join("agents").join("chaos").join(signal_run.name);
        let place = format!("[{}/{runs}]", FAULTS.len() + index + 1);
        let run_started = Instant::now();
        let (passed, lines) = match signal_run.run(&exe, &ws.root, &out_dir, &place) {
            Ok(found) => (found.failures.is_empty(), found.lines()),
            Err(error) => (false, vec![format!("FAILED: {error:#}")]),
        };
        println!(
            "==> chaos {}: {}",
            signal_run.name,
            if passed { "passed" } else { "FAILED" }
        );
        for line in &lines {
            println!("    {line}");
        }
        outcomes.push(Outcome {
            name: signal_run.name.to_owned(),
            seconds: run_started.elapsed().as_secs_f64(),
            passed,
            lines,
        });
    }

    println!("==> chaos summary");
    let mut failed = Vec::new();
    for outcome in &outcomes {
        println!(
            "    {:<12} {:>6.1}s  {}",
            outcome.name,
            outcome.seconds,
            if outcome.passed { "ok" } else { "FAILED" }
        );
        for line in &outcome.lines {
            println!("        {line}");
        }
        if !outcome.passed {
            failed.push(outcome.name.as_str());
        }
    }
    println!(
        "    {:<12} {:>6.1}s",
        "total",
        started.elapsed().as_secs_f64()
    );
    if !failed.is_empty() {
        bail!("chaos: {} failed", failed.join(", "));
    }
    Ok(ExitCode::SUCCESS)
}

/// The agents example from the release build CI shares (`RELEASE_BUILD` in `main.rs`); the
/// binary's path, as cargo reports it.
fn build_agents(ws: &Workspace) -> Result<PathBuf> {
    println!("==> chaos: cargo {}", crate::RELEASE_BUILD.join(" "));
    build_example(ws, "agents")
}

/// Where a release build's artifacts go: `$CARGO_TARGET_DIR/release` (made absolute), else
/// `target/release` under the root.
pub(crate) fn release_dir(ws: &Workspace) -> Result<PathBuf> {
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => std::path::absolute(Path::new(&dir))
            .with_context(|| format!("could not resolve {}", Path::new(&dir).display()))?,
        None => ws.root.join("target"),
    };
    Ok(target.join("release"))
}

/// The shared release build (`RELEASE_BUILD`); example `name`'s binary, as cargo reports it.
pub(crate) fn build_example(ws: &Workspace, name: &str) -> Result<PathBuf> {
    let output = Command::new(&ws.cargo)
        .args(crate::RELEASE_BUILD)
        .arg("--message-format=json-render-diagnostics")
        .current_dir(&ws.root)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .context("could not run cargo build")?;
    if !output.status.success() {
        bail!(
            "cargo {} failed ({})",
            crate::RELEASE_BUILD.join(" "),
            output.status
        );
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|line| example_executable(line, name))
        .with_context(|| format!("cargo build did not report the {name} example's executable"))
}

/// The executable of the example `name` in one line of cargo's JSON messages.
fn example_executable(line: &str, name: &str) -> Option<PathBuf> {
    let message: serde_json::Value = serde_json::from_str(line).ok()?;
    if message["reason"] != "compiler-artifact" || message["target"]["name"] != name {
        return None;
    }
    message["executable"].as_str().map(PathBuf::from)
}

/// Runs the agents example once with `args`, its output shown as it comes and its verdict kept;
/// stopped by its pid after [`RUN_LIMIT`]. Whether it exited 0, and its verdict.
fn run_one(exe: &Path, args: &[String], root: &Path) -> Result<(bool, Verdict)> {
    let (mut child, reader) = start_shown(exe, args, root, Verdict::default(), |verdict, line| {
        verdict.observe(&line);
    })?;
    let deadline = Instant::now() + RUN_LIMIT;
    let mut stopping: Option<Instant> = None;
    let status = loop {
        if let Some(status) = child.try_wait().context("waiting for the run")? {
            break status;
        }
        let now = Instant::now();
        match stopping {
            None if now >= deadline => {
                println!(
                    "==> chaos: the run is still going after {} s: SIGTERM",
                    RUN_LIMIT.as_secs()
                );
                services::signal_pid(child.id(), "TERM")?;
                stopping = Some(now + STOP_GRACE);
            }
            Some(by) if now >= by => {
                println!(
                    "==> chaos: no exit {} s after SIGTERM: SIGKILL",
                    STOP_GRACE.as_secs()
                );
                let _ = child.kill();
                break child.wait().context("waiting for the killed run")?;
            }
            _ => {}
        }
        thread::sleep(Duration::from_millis(100));
    };
    let verdict = reader
        .join()
        .map_err(|_| anyhow::anyhow!("the output reader panicked"))?;
    Ok((status.success() && stopping.is_none(), verdict))
}

/// Starts the agents example `exe` with `args` in `root`, its stdout read by a thread of its own
/// that shows each line as it comes and hands it to `each` with `state`; the child, and the
/// thread, which returns `state` once the output closes (and drops `each`).
fn start_shown<T: Send + 'static>(
    exe: &Path,
    args: &[String],
    root: &Path,
    mut state: T,
    mut each: impl FnMut(&mut T, String) + Send + 'static,
) -> Result<(Child, thread::JoinHandle<T>)> {
    let mut child = Command::new(exe)
        .args(args)
        .current_dir(root)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("could not start {}", exe.display()))?;
    let Some(stdout) = child.stdout.take() else {
        let _ = child.kill();
        let _ = child.wait();
        bail!("the run's stdout");
    };
    let reader = thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            println!("{line}");
            each(&mut state, line);
        }
        state
    });
    Ok((child, reader))
}

/// A run whose fleet parent gets a signal mid-run (see the module docs).
#[derive(Clone, Copy, Debug)]
struct SignalRun {
    name: &'static str,
    /// The signal, as `kill -s` names it.
    signal: &'static str,
    /// The fleet runs on the parent's own private redis-server (checked to be gone with the
    /// parent), not on one this step starts (checked to hold nothing).
    private: bool,
}

/// What a signal run found: what it saw, and what fails it.
#[derive(Debug, Default)]
struct Found {
    seen: Vec<String>,
    failures: Vec<String>,
}

impl Found {
    fn saw(&mut self, line: impl Into<String>) {
        self.seen.push(line.into());
    }

    fn fail(&mut self, line: impl Into<String>) {
        self.failures.push(line.into());
    }

    /// What the run prints as its verdict: what it saw, then each failure, or `passed`.
    fn lines(&self) -> Vec<String> {
        let mut lines = self.seen.clone();
        if self.failures.is_empty() {
            lines.push("passed".to_owned());
        }
        lines.extend(self.failures.iter().map(|f| format!("FAILED: {f}")));
        lines
    }
}

/// The parent process of a signal run, SIGKILLed and reaped if it is still running when this
/// is dropped (an early return).
struct Parent(Child);

impl Drop for Parent {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

impl SignalRun {
    /// `SIGTERM`, `SIGKILL`: the name the parent prints.
    fn signal_name(self) -> String {
        format!("SIG{}", self.signal)
    }

    /// Runs it: on a `redis-server` started for the run (stopped after it), or on the parent's
    /// own private server.
    fn run(self, exe: &Path, root: &Path, out_dir: &Path, place: &str) -> Result<Found> {
        println!(
            "==> chaos {place} {}: {} to the fleet's parent mid-run, on {}",
            self.name,
            self.signal_name(),
            if self.private {
                "the parent's own private redis-server"
            } else {
                "a redis-server of the run's own"
            }
        );
        // A member's report left by an earlier run must not stand in for this one's.
        let _ = fs::remove_dir_all(out_dir.join("fleet"));
        let mut args: Vec<String> = RUN_ARGS.iter().map(|a| a.to_string()).collect();
        let redis = if self.private {
            None
        } else {
            let redis = services::start(&[Service::Redis])?;
            let port = redis
                .env()
                .iter()
                .find_map(|(_, url)| redis_port(url))
                .context("the redis-server started for the run has no port in its URL")?;
            args.extend(["--redis".to_owned(), format!("127.0.0.1:{port}")]);
            Some((redis, port))
        };
        args.extend(["--out-dir".to_owned(), out_dir.display().to_string()]);
        println!(
            "==> chaos {}: {} {} ({} to the parent {:.1} s after its `== fleet:` line)",
            self.name,
            exe.display(),
            args.join(" "),
            self.signal_name(),
            SIGNAL_AFTER.as_secs_f64()
        );
        let _ = std::io::stdout().flush();
        let found = self.drive(
            exe,
            &args,
            root,
            redis.as_ref().map(|(_, port)| *port),
            out_dir,
        );
        let mut found = found?;
        if let Some((redis, _)) = redis
            && let Err(error) = redis.stop()
        {
            found.fail(format!("the run's redis-server did not stop: {error:#}"));
        }
        Ok(found)
    }

    /// Starts the parent, signals it mid-run, and checks the parent's output, its members and
    /// the server: on `port`, the one started for the run, nothing held; else the parent's own
    /// private server, gone with it.
    fn drive(
        self,
        exe: &Path,
        args: &[String],
        root: &Path,
        port: Option<u16>,
        out_dir: &Path,
    ) -> Result<Found> {
        let mut found = Found::default();
        let signal_name = self.signal_name();
        let out_dir_text = out_dir.display().to_string();
        let (tx, lines) = mpsc::channel();
        // Once the receiver is gone the lines are still shown; the sender goes with the thread.
        let (child, _) = start_shown(exe, args, root, (), move |(), line| {
            let _ = tx.send(line);
        })?;
        let mut parent = Parent(child);
        let mut out = ParentOutput::default();

        // The parent's `== fleet:` line: its cells exist, its members start (on the server it
        // named before, if it started its own).
        let fleet_at = wait_for(&lines, &mut out, Instant::now() + STARTUP_LIMIT);
        let port = port.or(out.private.as_ref().map(|p| p.port));
        let endpoint = port.map(|port| format!("127.0.0.1:{port}"));
        let members_now = || {
            endpoint
                .as_deref()
                .map_or_else(Vec::new, |e| running_members(e, &out_dir_text))
        };
        let (Some(fleet_at), Some(port)) = (fleet_at, port) else {
            found.fail(if fleet_at.is_none() {
                format!(
                    "the parent printed no `== fleet:` line within {} s (or exited first)",
                    STARTUP_LIMIT.as_secs()
                )
            } else {
                format!("the parent printed no `{PRIVATE_SERVER_PREFIX}` line before its `== fleet:` line")
            });
            drop(parent);
            stop_members(
                &members_now,
                Instant::now() + MEMBER_EXIT_LIMIT,
                &format!(
                    "{} s after the parent was stopped",
                    MEMBER_EXIT_LIMIT.as_secs()
                ),
                &mut found,
            );
            return Ok(found);
        };
        if let Some(private) = &out.private {
            found.saw(format!(
                "the parent's private redis-server: pid {}, port {}, directory {}",
                private.pid, private.port, private.dir
            ));
        }
        // Its members running.
        let mut seen = BTreeSet::new();
        loop {
            seen.extend(members_now());
            if seen.len() >= FLEET as usize
                || Instant::now() >= fleet_at + MEMBERS_WITHIN
                || !matches!(parent.0.try_wait(), Ok(None))
            {
                break;
            }
            take_lines(&lines, &mut out);
            thread::sleep(Duration::from_millis(50));
        }
        let pids = join_pids(&seen);
        if seen.len() < FLEET as usize {
            found.fail(format!(
                "{} of {FLEET} members seen running within {} s of the `== fleet:` line (pids {pids})",
                seen.len(),
                MEMBERS_WITHIN.as_secs()
            ));
        }
        // The signal, mid-run; never to a parent already reaped, whose pid may be another's.
        pause_until(&lines, &mut out, fleet_at + SIGNAL_AFTER);
        let signalled = Instant::now();
        let status = if let Ok(Some(status)) = parent.0.try_wait() {
            found.fail(format!(
                "the parent exited ({status}) before its {signal_name}: nothing was tested"
            ));
            Some(status)
        } else {
            services::signal_pid(parent.0.id(), self.signal)?;
            found.saw(format!(
                "{signal_name} to the parent (pid {}) {:.2} s after its `== fleet:` line, its members running (pids {pids})",
                parent.0.id(),
                signalled.duration_since(fleet_at).as_secs_f64()
            ));
            // A SIGTERMed parent stops its members, reports and exits by itself; a SIGKILLed
            // one at once.
            let limit = if self.signal == "TERM" {
                TERM_EXIT_LIMIT
            } else {
                MEMBER_EXIT_LIMIT
            };
            match wait_child(&mut parent.0, signalled + limit, &lines, &mut out) {
                Some(status) => {
                    found.saw(format!(
                        "the parent exited ({status}) {:.2} s after the signal",
                        signalled.elapsed().as_secs_f64()
                    ));
                    Some(status)
                }
                None => {
                    found.fail(format!(
                        "the parent was still running {} s after its {signal_name}: SIGKILLed",
                        limit.as_secs()
                    ));
                    let _ = parent.0.kill();
                    parent.0.wait().ok()
                }
            }
        };
        if !drain(&lines, &mut out, Instant::now() + OUTPUT_DRAIN) {
            found.fail(format!(
                "the parent's output was still open {} s after it exited",
                OUTPUT_DRAIN.as_secs()
            ));
        }

        // Its members: gone with a SIGTERMed parent, gone soon after a SIGKILLed one.
        if self.signal == "TERM" {
            let left = members_now();
            if left.is_empty() {
                found.saw("no member left running once the parent exited");
            } else {
                found.fail(format!(
                    "members still running once the parent exited (pids {})",
                    join_pids(&left)
                ));
                stop_members(
                    &members_now,
                    Instant::now() + MEMBER_EXIT_LIMIT,
                    &format!("{} s after the parent exited", MEMBER_EXIT_LIMIT.as_secs()),
                    &mut found,
                );
            }
            judge_term(
                &out,
                status.and_then(|s| s.code()),
                &signal_name,
                &mut found,
            );
        } else {
            // The private server and its directory watched meanwhile, from the signal on.
            let gone = out
                .private
                .clone()
                .filter(|_| self.private)
                .map(|private| thread::spawn(move || watch_gone(&private, signalled)));
            let left = stop_members(
                &members_now,
                signalled + MEMBER_EXIT_LIMIT,
                &format!(
                    "{} s after the parent's {signal_name}",
                    MEMBER_EXIT_LIMIT.as_secs()
                ),
                &mut found,
            );
            if left.is_empty() {
                found.saw(format!(
                    "every member exited within {:.2} s of the parent's {signal_name}",
                    signalled.elapsed().as_secs_f64()
                ));
            }
            judge_reports(&out_dir.join("fleet"), &mut found);
            if let (Some(private), Some(gone)) = (&out.private, gone) {
                match gone.join() {
                    Ok(gone) => judge_gone(private, gone, &mut found),
                    Err(_) => found.fail("the watch of the private redis-server panicked"),
                }
            }
        }

        // The parent's private server gone with it (above), or nothing held on the run's own.
        if self.private {
            if out.private.is_none() {
                found.fail("the parent named no private redis-server");
            }
            return Ok(found);
        }
        match read_cells(port) {
            Ok(cells) if cells.is_empty() => {
                found.fail("no cell found on the run's redis-server: nothing to check");
            }
            Ok(cells) => {
                let held: Vec<String> = cells
                    .iter()
                    .filter_map(|(cell, held)| held.describe().map(|h| format!("{cell}: {h}")))
                    .collect();
                if held.is_empty() {
                    found.saw(format!(
                        "redis: {} cells, nothing held (exp, line and live empty or absent; occ without st, sb, r: or q:)",
                        cells.len()
                    ));
                }
                for line in held {
                    found.fail(format!("redis: {line}"));
                }
            }
            Err(error) => found.fail(format!("redis: the cells could not be read: {error:#}")),
        }
        Ok(found)
    }
}

/// Waits until `find` finds no member or `by` passes; those still running then are SIGKILLed by
/// pid, named in a failure and returned.
fn stop_members(
    find: &dyn Fn() -> Vec<u32>,
    by: Instant,
    bound: &str,
    found: &mut Found,
) -> Vec<u32> {
    let mut left = find();
    while !left.is_empty() && Instant::now() < by {
        thread::sleep(Duration::from_millis(50));
        left = find();
    }
    if !left.is_empty() {
        found.fail(format!(
            "members still running {bound} (pids {}): SIGKILLed",
            join_pids(&left)
        ));
        for &pid in &left {
            let _ = services::signal_pid(pid, "KILL");
        }
        let until = Instant::now() + Duration::from_secs(2);
        while !find().is_empty() && Instant::now() < until {
            thread::sleep(Duration::from_millis(50));
        }
    }
    left
}

fn join_pids<'a>(pids: impl IntoIterator<Item = &'a u32>) -> String {
    let pids: Vec<String> = pids.into_iter().map(u32::to_string).collect();
    if pids.is_empty() {
        "none".to_owned()
    } else {
        pids.join(", ")
    }
}

/// Reads the parent's lines into `out` until its `== fleet:` line or `by`: when that line came,
/// or `None` (also when the output closed first).
fn wait_for(lines: &Receiver<String>, out: &mut ParentOutput, by: Instant) -> Option<Instant> {
    while !out.fleet_started {
        let left = by.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        match lines.recv_timeout(left) {
            Ok(line) => out.observe(&line),
            Err(RecvTimeoutError::Timeout) => return None,
            Err(RecvTimeoutError::Disconnected) => return None,
        }
    }
    Some(Instant::now())
}

/// Reads the lines that already came.
fn take_lines(lines: &Receiver<String>, out: &mut ParentOutput) {
    while let Ok(line) = lines.try_recv() {
        out.observe(&line);
    }
}

/// Reads the parent's lines until `at`.
fn pause_until(lines: &Receiver<String>, out: &mut ParentOutput, at: Instant) {
    loop {
        let left = at.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        match lines.recv_timeout(left) {
            Ok(line) => out.observe(&line),
            Err(RecvTimeoutError::Timeout) => return,
            Err(RecvTimeoutError::Disconnected) => thread::sleep(left),
        }
    }
}

/// Reads the parent's lines until its output closes (true) or `by` passes (false).
fn drain(lines: &Receiver<String>, out: &mut ParentOutput, by: Instant) -> bool {
    loop {
        let left = by.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => out.observe(&line),
            Err(RecvTimeoutError::Timeout) => return false,
            Err(RecvTimeoutError::Disconnected) => return true,
        }
    }
}

/// Waits for `child` to exit until `by`, reading its lines meanwhile; its status, or `None`
/// if it is still running.
fn wait_child(
    child: &mut Child,
    by: Instant,
    lines: &Receiver<String>,
    out: &mut ParentOutput,
) -> Option<ExitStatus> {
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) => {}
            Err(_) => return child.wait().ok(),
        }
        if Instant::now() >= by {
            return None;
        }
        match lines.recv_timeout(Duration::from_millis(50)) {
            Ok(line) => out.observe(&line),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// What a fleet parent printed that a signal run looks at.
#[derive(Debug, Default, PartialEq, Eq)]
struct ParentOutput {
    /// Its `private redis-server: ...` line, read.
    private: Option<PrivateServer>,
    /// Its `== fleet: ...` line: the cells exist, the members start.
    fleet_started: bool,
    /// The signals it said it forwarded (`SIGTERM: forwarded to every member; ...`).
    forwarded: Vec<String>,
    /// The per-process table's header (`process agents completed ...`).
    process_table: bool,
    /// The per-model table's header (`model tokens ceiling ...`).
    model_table: bool,
    /// `(R of N processes reported; ...`: R and N.
    reported: Option<(u32, u32)>,
    /// `check: ...` lines: the verdict.
    check: Vec<String>,
}

impl ParentOutput {
    fn observe(&mut self, line: &str) {
        let line = line.trim_end();
        let words: Vec<&str> = line.split_whitespace().take(3).collect();
        if let Some(private) = PrivateServer::parse(line) {
            self.private = Some(private);
        } else if line.starts_with("== fleet: ") {
            self.fleet_started = true;
        } else if let Some((signal, _)) = line.split_once(": forwarded to every member")
            && signal.starts_with("SIG")
            && !signal.contains(' ')
        {
            self.forwarded.push(signal.to_owned());
        } else if words == ["process", "agents", "completed"] {
            self.process_table = true;
        } else if words == ["model", "tokens", "ceiling"] {
            self.model_table = true;
        } else if let Some(reported) = processes_reported(line) {
            self.reported = Some(reported);
        } else if line.starts_with("check: ") {
            self.check.push(line.to_owned());
        }
    }
}

/// A parent's private redis-server, as its line names it: `private redis-server: pid N, port P,
/// directory D (...)`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct PrivateServer {
    pid: u32,
    port: u16,
    dir: String,
}

impl PrivateServer {
    fn parse(line: &str) -> Option<PrivateServer> {
        let rest = line
            .strip_prefix(PRIVATE_SERVER_PREFIX)?
            .strip_prefix("pid ")?;
        let (pid, rest) = rest.split_once(", port ")?;
        let (port, rest) = rest.split_once(", directory ")?;
        let dir = rest.split_once(" (").map_or(rest, |(dir, _)| dir);
        Some(PrivateServer {
            pid: pid.parse().ok().filter(|p| *p != 0)?,
            port: port.parse().ok()?,
            dir: dir.to_owned(),
        })
        .filter(|p| !p.dir.is_empty())
    }
}

/// When a SIGKILLed parent's private redis-server was seen gone (no `/proc` entry, or a zombie)
/// and its directory removed, after `signalled`; each `None` if not within [`SERVER_GONE_LIMIT`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Gone {
    server: Option<Duration>,
    dir: Option<Duration>,
}

/// Polls every 20 ms, from `signalled` for up to [`SERVER_GONE_LIMIT`], until `private`'s server
/// is gone and its directory removed; a server still running then is SIGKILLed by pid.
fn watch_gone(private: &PrivateServer, signalled: Instant) -> Gone {
    let by = signalled + SERVER_GONE_LIMIT;
    let dir = Path::new(&private.dir);
    let mut gone = Gone::default();
    loop {
        let now = Instant::now();
        if gone.server.is_none() && !server_runs(private.pid) {
            gone.server = Some(now.duration_since(signalled));
        }
        if gone.dir.is_none() && !dir.exists() {
            gone.dir = Some(now.duration_since(signalled));
        }
        if (gone.server.is_some() && gone.dir.is_some()) || now >= by {
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    if gone.server.is_none() {
        let _ = services::signal_pid(private.pid, "KILL");
    }
    gone
}

/// The verdict on a SIGKILLed parent's private redis-server: gone and its directory removed
/// within [`SERVER_GONE_LIMIT`] of the signal.
fn judge_gone(private: &PrivateServer, gone: Gone, found: &mut Found) {
    match gone.server {
        Some(after) => found.saw(format!(
            "the private redis-server (pid {}) was gone {:.2} s after the parent's SIGKILL",
            private.pid,
            after.as_secs_f64()
        )),
        None => found.fail(format!(
            "the private redis-server (pid {}) was still running {} s after the parent's SIGKILL: SIGKILLed",
            private.pid,
            SERVER_GONE_LIMIT.as_secs()
        )),
    }
    match gone.dir {
        Some(after) => found.saw(format!(
            "its directory {} was removed {:.2} s after",
            private.dir,
            after.as_secs_f64()
        )),
        None => found.fail(format!(
            "its directory {} still existed {} s after the parent's SIGKILL",
            private.dir,
            SERVER_GONE_LIMIT.as_secs()
        )),
    }
}

/// Whether `pid` is a `redis-server` that runs: its `/proc` command line names it (a pid taken
/// again by another process is not it) and it is no zombie.
fn server_runs(pid: u32) -> bool {
    fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|raw| {
        cmdline_args(&raw)
            .iter()
            .any(|a| a.contains("redis-server"))
    }) && !is_zombie(pid)
}

/// `(R of N processes reported; ...`: R and N.
fn processes_reported(line: &str) -> Option<(u32, u32)> {
    let (counts, _) = line.strip_prefix('(')?.split_once(" processes reported")?;
    let (reported, of) = counts.split_once(" of ")?;
    Some((reported.parse().ok()?, of.parse().ok()?))
}

/// A signalled parent's `check:` lines, sorted: those that are the signal's own doing (the run
/// stopped by it, a member interrupted by it, its jobs cancelled) and the others.
#[derive(Debug, Default, PartialEq, Eq)]
struct SignalChecks {
    /// A `check: passed` line.
    passed: bool,
    /// `check: FAILED:` lines.
    failed: usize,
    /// `check: FAILED: the run was stopped by SIGNAL...`.
    stopped: bool,
    /// `check: FAILED: process I: monitor: interrupted (... SIGNAL)`.
    interrupted: u32,
    /// `check: FAILED: process I: monitor: N jobs were cancelled`: the Ns added up.
    cancelled: u64,
    /// Every other line: not the signal's doing.
    other: Vec<String>,
}

impl SignalChecks {
    fn of(check: &[String], signal: &str) -> SignalChecks {
        let mut sorted = SignalChecks::default();
        for line in check {
            if line.starts_with("check: passed") {
                sorted.passed = true;
                continue;
            }
            let Some(problem) = line.strip_prefix("check: FAILED: ") else {
                sorted.other.push(line.clone());
                continue;
            };
            sorted.failed += 1;
            if problem.starts_with(&format!("the run was stopped by {signal}")) {
                sorted.stopped = true;
                continue;
            }
            let what = problem
                .strip_prefix("process ")
                .and_then(|rest| rest.split_once(": "))
                .filter(|(index, _)| index.parse::<u32>().is_ok())
                .and_then(|(_, rest)| rest.strip_prefix("monitor: "));
            if let Some(what) = what {
                if what.starts_with("interrupted (") && what.contains(signal) {
                    sorted.interrupted += 1;
                    continue;
                }
                if let Some(n) = what
                    .strip_suffix(" jobs were cancelled")
                    .and_then(|n| n.parse::<u64>().ok())
                {
                    sorted.cancelled += n;
                    continue;
                }
            }
            sorted.other.push(line.clone());
        }
        sorted
    }
}

/// The verdict on a SIGTERMed parent's output and exit code (see the module docs).
fn judge_term(out: &ParentOutput, code: Option<i32>, signal: &str, found: &mut Found) {
    if !out.forwarded.iter().any(|s| s == signal) {
        found.fail(format!(
            "the parent never said it forwarded {signal} to its members"
        ));
    }
    if !(out.process_table && out.model_table) {
        found.fail(format!(
            "the fleet's table was not printed (per-process header: {}, per-model header: {})",
            out.process_table, out.model_table
        ));
    }
    match out.reported {
        Some((reported, of)) if reported == of && of == FLEET => {}
        Some((reported, of)) => found.fail(format!("{reported} of {of} processes reported")),
        None => found.fail("no `(R of N processes reported` line"),
    }
    if out.check.is_empty() {
        found.fail("no verdict (`check:` line) printed");
        return;
    }
    let checks = SignalChecks::of(&out.check, signal);
    for line in &checks.other {
        found.fail(format!("not the signal's doing: {line}"));
    }
    let expected = if checks.failed > 0 { 1 } else { 0 };
    if code != Some(expected) {
        found.fail(format!(
            "the parent exited with code {code:?}, not {expected} as its verdict says"
        ));
    }
    let reported = out
        .reported
        .map_or_else(|| "?".to_owned(), |(r, n)| format!("{r} of {n}"));
    found.saw(if checks.passed && checks.failed == 0 {
        format!("the parent printed its tables ({reported} processes reported) and `check: passed`")
    } else {
        format!(
            "the parent printed its tables ({reported} processes reported) and {} `check:` lines, {} of them the signal's own: stopped by {signal}: {}, members interrupted by it: {}, jobs cancelled: {}",
            out.check.len(),
            out.check.len() - checks.other.len(),
            if checks.stopped { "yes" } else { "no" },
            checks.interrupted,
            checks.cancelled
        )
    });
}

/// The members' reports after their parent was SIGKILLed: each must have written one, and at
/// least one must say it was interrupted.
fn judge_reports(fleet_dir: &Path, found: &mut Found) {
    let mut reported = 0;
    let mut interrupted = Vec::new();
    for index in 0..FLEET {
        let path = fleet_dir.join(format!("member-{index}.out"));
        let text = fs::read_to_string(&path).unwrap_or_default();
        match member_interrupted(&text) {
            Ok(why) => {
                reported += 1;
                interrupted.extend(why);
            }
            Err(why) => found.fail(format!("member {index}: {why} ({})", path.display())),
        }
    }
    match interrupted.first() {
        Some(first) => found.saw(format!(
            "{reported} of {FLEET} members reported, {} interrupted (\"{first}\")",
            interrupted.len()
        )),
        None => found.fail(format!(
            "{reported} of {FLEET} members reported, none interrupted: the kill tested nothing"
        )),
    }
}

/// A member's report in its output (its last [`REPORT_PREFIX`] line): `Err` without one, else
/// the problem in it that says the member was interrupted, if any.
fn member_interrupted(stdout: &str) -> Result<Option<String>, String> {
    let line = stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(REPORT_PREFIX))
        .ok_or("no report line in its output")?;
    let report: serde_json::Value =
        serde_json::from_str(line).map_err(|e| format!("its report line is not JSON: {e}"))?;
    let problems = report["problems"]
        .as_array()
        .ok_or("its report has no `problems` list")?;
    Ok(problems
        .iter()
        .filter_map(serde_json::Value::as_str)
        .find(|p| p.contains("interrupted ("))
        .map(str::to_owned))
}

/// The port of a `redis://HOST:PORT/` URL.
fn redis_port(url: &str) -> Option<u16> {
    let rest = url.strip_prefix("redis://")?;
    let authority = rest.split('/').next()?;
    authority.rsplit_once(':')?.1.parse().ok()
}

/// The pids of this run's fleet members still running (see [`is_fleet_member`]), from `/proc`.
fn running_members(endpoint: &str, out_dir: &str) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|raw| is_fleet_member(&cmdline_args(&raw), endpoint, out_dir))
                && !is_zombie(*pid)
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// The arguments in a `/proc/PID/cmdline` (NUL-separated).
fn cmdline_args(raw: &[u8]) -> Vec<String> {
    raw.split(|b| *b == 0)
        .filter(|arg| !arg.is_empty())
        .map(|arg| String::from_utf8_lossy(arg).into_owned())
        .collect()
}

/// Whether `args` are those of a member of this run: `--fleet-member`, this run's `--redis`
/// endpoint, and an argument under its out directory (the member's own `--out-dir`).
fn is_fleet_member(args: &[String], endpoint: &str, out_dir: &str) -> bool {
    let under = format!("{out_dir}/");
    args.iter().any(|a| a == "--fleet-member")
        && args.iter().any(|a| a == endpoint)
        && args.iter().any(|a| a.starts_with(&under))
}

/// Whether `pid` has exited but is not reaped (a container's pid 1 may never reap an orphan).
fn is_zombie(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| matches!(state, 'Z' | 'X'))
    })
}

/// What one cell still holds (see the module docs); all zero when nothing.
#[derive(Debug, Default, PartialEq, Eq)]
struct Held {
    /// `ZCARD exp`: leases.
    leases: i64,
    /// `ZCARD line`: waiting tickets.
    waiting: i64,
    /// `ZCARD live`: waiting tickets' liveness.
    live: i64,
    /// `HGET occ st`: transfers in flight.
    transfers: i64,
    /// `HGET occ sb`: bytes in flight.
    bytes: i64,
    /// `r:<id>` fields of `occ`: lease records.
    lease_records: u64,
    /// `q:<id>` fields of `occ`: waiter records.
    waiter_records: u64,
}

impl Held {
    /// What is held, or `None` for nothing.
    fn describe(&self) -> Option<String> {
        let parts: Vec<String> = [
            (self.leases, "leases in exp"),
            (self.waiting, "tickets in line"),
            (self.live, "tickets in live"),
            (self.transfers, "transfers in flight (occ st)"),
            (self.bytes, "bytes in flight (occ sb)"),
            (self.lease_records as i64, "lease records (occ r:)"),
            (self.waiter_records as i64, "waiter records (occ q:)"),
        ]
        .into_iter()
        .filter(|(n, _)| *n != 0)
        .map(|(n, what)| format!("{n} {what}"))
        .collect();
        (!parts.is_empty()).then(|| format!("held: {}", parts.join(", ")))
    }
}

/// Every cell on the server at `port` and what it holds, read with `redis-cli`.
fn read_cells(port: u16) -> Result<Vec<(String, Held)>> {
    let cells = cells_in(&redis_cli(port, &["--scan"])?);
    let mut out = Vec::new();
    for cell in cells {
        let key = |suffix: &str| format!("{cell}:{suffix}");
        let occ = counts(&redis_cli(port, &["HMGET", &key("occ"), "st", "sb"])?, 2)?;
        let (lease_records, waiter_records) = records(&redis_cli(port, &["HKEYS", &key("occ")])?);
        let held = Held {
            leases: counts(&redis_cli(port, &["ZCARD", &key("exp")])?, 1)?[0],
            waiting: counts(&redis_cli(port, &["ZCARD", &key("line")])?, 1)?[0],
            live: counts(&redis_cli(port, &["ZCARD", &key("live")])?, 1)?[0],
            transfers: occ[0],
            bytes: occ[1],
            lease_records,
            waiter_records,
        };
        out.push((cell, held));
    }
    Ok(out)
}

/// `redis-cli --raw -h 127.0.0.1 -p PORT ARGS...`: its output.
fn redis_cli(port: u16, args: &[&str]) -> Result<String> {
    let output = Command::new("redis-cli")
        .args(["--raw", "-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context(
            "could not run `redis-cli` (it comes with redis-server: `apt-get install redis-tools`)",
        )?;
    if !output.status.success() {
        bail!(
            "redis-cli {} exited with {}: {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The cells named by `keys` (one a line, as `redis-cli --scan` prints them): each key's part
/// before its last `:` when what follows names one of a cell's keys.
fn cells_in(keys: &str) -> BTreeSet<String> {
    keys.lines()
        .filter_map(|key| key.trim().rsplit_once(':'))
        .filter(|(_, suffix)| CELL_KEYS.contains(suffix))
        .map(|(cell, _)| cell.to_owned())
        .collect()
}

/// `n` integer replies, one a line (`redis-cli --raw`); an empty line (nil: no such key or field)
/// is 0; anything else (an error) is an error.
fn counts(reply: &str, n: usize) -> Result<Vec<i64>> {
    let values = reply
        .lines()
        .map(|line| match line.trim() {
            "" => Ok(0),
            value => value
                .parse::<i64>()
                .map_err(|_| anyhow::anyhow!("unexpected reply {reply:?}")),
        })
        .collect::<Result<Vec<i64>>>()?;
    if values.len() != n {
        bail!("expected {n} replies, got {reply:?}");
    }
    Ok(values)
}

/// The lease records (`r:<id>`) and waiter records (`q:<id>`) among a hash's fields, one a line.
fn records(fields: &str) -> (u64, u64) {
    fields.lines().fold((0, 0), |(leases, waiters), field| {
        let field = field.trim();
        (
            leases + u64::from(field.starts_with("r:")),
            waiters + u64::from(field.starts_with("q:")),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verdict_is_the_chaos_and_check_lines() {
        let mut verdict = Verdict::default();
        for line in [
            "== fleet: 4 processes ==",
            "chaos: restart at +1.00 s after the members started",
            "chaos: jobs failed: 3 of 400 (0.8 %; 3 timed out, 0 failed); 3 with their own deadline between the fault and the resumption, 0 not",
            "check: passed (the fault was injected, ...)\n",
        ] {
            verdict.observe(line);
        }
        assert_eq!(
            verdict.chaos,
            [
                "chaos: jobs failed: 3 of 400 (0.8 %; 3 timed out, 0 failed); 3 with their own deadline between the fault and the resumption, 0 not"
            ]
        );
        assert_eq!(
            verdict.check,
            ["check: passed (the fault was injected, ...)"]
        );
        assert!(verdict.passed());

        verdict.observe("check: FAILED: model-a: 1 leases (300 tokens, 1 requests) still held");
        assert!(!verdict.passed());
        assert!(!Verdict::default().passed());

        // A failover's run keeps its election, its jobs and its resumption, not the log lines of
        // its course.
        let mut verdict = Verdict::default();
        let failover = [
            "chaos: master 127.0.0.1:41217 (slot 972, model-a's cell; cells on it: model-a): SIGKILLed at +1.00 s; waiting for a replica to take over",
            "chaos: failover: 127.0.0.1:39725 took the slot over at +3.26 s, 2254 ms after the fault; the cluster was ok again at +3.26 s; ...",
            "chaos: kill-master: from the fault at +1.00 s to the first admission after it at +13.21 s (12.21 s); ...",
            "chaos: election: a replica took the killed master's slots over 2254 ms after the fault (at +3.26 s); the cluster was ok again at +3.26 s",
            "chaos: jobs failed: 117 of 400 (29.2 %; 117 timed out, 0 failed); 117 with their own deadline between the fault and the resumption, 0 not",
            "chaos: resumed: first admission on the failed-over cells 9956 ms after the cluster was ok again, bound 7745 to 11000 ms: ok (at +13.21 s)",
            "chaos: most held at once by the members' clocks: ...",
            "check: passed (the fault was injected, ...)",
        ];
        for line in failover {
            verdict.observe(line);
        }
        assert_eq!(verdict.chaos, [failover[3], failover[4], failover[5]]);
        assert!(verdict.passed());
        assert_eq!(verdict.jobs, Some((117, 400)));
        assert_eq!(
            verdict.resumed,
            Some(Resumed {
                after_ms: Some(9_956),
                bound_ms: (7_745, 11_000),
                ok: true
            })
        );
        assert_eq!(verdict.recovered, None);
        assert_eq!(
            Bound::of("kill-master").unwrap().judge(&verdict),
            Vec::<String>::new()
        );
        verdict.observe("chaos: recovery: 1 after the fault (model-a promoted at +3.21 s)");
        assert_eq!(verdict.recovered, Some(true));
        assert_eq!(verdict.chaos.len(), 4);
    }

    #[test]
    fn resumed_lines_and_job_counts_are_read() {
        assert_eq!(
            Resumed::parse(
                "chaos: resumed: first admission 102 ms after the server was ready again, bound 0 to 500 ms: ok (at +3.17 s)"
            ),
            Some(Resumed {
                after_ms: Some(102),
                bound_ms: (0, 500),
                ok: true
            })
        );
        assert_eq!(
            Resumed::parse(
                "chaos: resumed: first admission 10154 ms after the new server process started, bound 10000 to 11000 ms: FAILED (at +13.17 s; 10101 ms after the server was ready again)"
            ),
            Some(Resumed {
                after_ms: Some(10_154),
                bound_ms: (10_000, 11_000),
                ok: false
            })
        );
        assert_eq!(
            Resumed::parse(
                "chaos: resumed: no admission on the failed-over cells after the cluster was ok again, bound 7745 to 11000 ms: FAILED"
            ),
            Some(Resumed {
                after_ms: None,
                bound_ms: (7_745, 11_000),
                ok: false
            })
        );
        assert_eq!(Resumed::parse("chaos: resumed: soon"), None);
        assert_eq!(Resumed::parse("chaos: first admission 5 ms after"), None);
        assert_eq!(
            jobs_failed(
                "chaos: jobs failed: 168 of 400 (42.0 %; 168 timed out, 0 failed); 168 with ..."
            ),
            Some((168, 400))
        );
        assert_eq!(jobs_failed("chaos: jobs failed: 3 (3 timed out)"), None);
    }

    #[test]
    fn each_fault_is_held_to_its_own_bound() {
        let verdict = |lines: &[&str]| {
            let mut verdict = Verdict::default();
            for line in lines {
                verdict.observe(line);
            }
            verdict
        };
        let lossless = Bound::of("restart-fsync").unwrap();
        let clean = verdict(&[
            "chaos: jobs failed: 0 of 400 (0.0 %; 0 timed out, 0 failed); 0 with their own deadline between the fault and the resumption, 0 not",
            "chaos: resumed: first admission 102 ms after the server was ready again, bound 0 to 500 ms: ok (at +3.17 s)",
            "chaos: recovery: none after the fault",
        ]);
        assert_eq!(lossless.judge(&clean), Vec::<String>::new());
        // A job failed, a cell recovered, the first admission out of its bound.
        let bad = verdict(&[
            "chaos: jobs failed: 2 of 400 (0.5 %; 2 timed out, 0 failed); 2 with their own deadline between the fault and the resumption, 0 not",
            "chaos: resumed: first admission 10102 ms after the server was ready again, bound 0 to 500 ms: FAILED (at +13.17 s)",
            "chaos: recovery: 3 after the fault (model-a restarted at +3.16 s, ...): FAILED (...)",
        ]);
        assert_eq!(
            lossless.judge(&bad),
            [
                "the first admission came 10102 ms after the reference, outside 0 to 500 ms",
                "2 jobs failed through a fault that loses nothing acknowledged",
                "no `chaos: recovery: none` line after a fault that loses nothing acknowledged",
            ]
        );
        // Admission that never resumed, and a run that printed nothing to judge.
        let never = verdict(&[
            "chaos: jobs failed: 160 of 400 (40.0 %; 160 timed out, 0 failed); 0 with their own deadline between the fault and the resumption, 160 not",
            "chaos: resumed: no admission after the new server process started, bound 10000 to 11000 ms: FAILED",
        ]);
        let restart = Bound::of("restart").unwrap();
        assert_eq!(
            restart.judge(&never),
            ["admission never resumed after the fault"]
        );
        assert_eq!(
            restart.judge(&Verdict::default()),
            [
                "no `chaos: resumed:` line: when admission resumed is unknown",
                "no `chaos: jobs failed:` line",
            ]
        );
        // A run that loosened its bound, or resumed before a lossy restart's recovery ended.
        let loose = verdict(&[
            "chaos: jobs failed: 0 of 400 (0.0 %)",
            "chaos: resumed: first admission 1500 ms after the new server process started, bound 0 to 20000 ms: ok (at +4.5 s)",
        ]);
        assert_eq!(
            restart.judge(&loose),
            [
                "the run's bound is 0 to 20000 ms, not the restart's 10000 to 11000 ms",
                "the first admission came 1500 ms after the reference, outside 0 to 20000 ms",
            ][..1]
        );
        let early = verdict(&[
            "chaos: jobs failed: 0 of 400 (0.0 %)",
            "chaos: resumed: first admission 9000 ms after the new server process started, bound 10000 to 11000 ms: FAILED (at +12 s)",
        ]);
        assert_eq!(
            restart.judge(&early),
            ["the first admission came 9000 ms after the reference, outside 10000 to 11000 ms"]
        );
        assert!(Bound::of("reboot").is_none());
        assert_eq!(
            BOUNDS.map(|b| b.fault),
            FAULTS,
            "every fault has its bound, in the same order"
        );
    }

    #[test]
    fn the_agents_executable_is_read_from_cargos_messages() {
        let artifact = r#"{"reason":"compiler-artifact","target":{"name":"agents","kind":["example"]},"executable":"/w/target/release/examples/agents"}"#;
        assert_eq!(
            example_executable(artifact, "agents"),
            Some(PathBuf::from("/w/target/release/examples/agents"))
        );
        let other =
            r#"{"reason":"compiler-artifact","target":{"name":"axum"},"executable":"/w/x"}"#;
        assert_eq!(example_executable(other, "agents"), None);
        assert_eq!(
            example_executable(other, "axum"),
            Some(PathBuf::from("/w/x"))
        );
        assert_eq!(
            example_executable(r#"{"reason":"build-finished","success":true}"#, "agents"),
            None
        );
        assert_eq!(example_executable("not json", "agents"), None);
    }

    /// What a SIGTERMed parent printed in a run by hand (the table's rows shortened).
    const TERM_OUTPUT: &[&str] = &[
        "== fleet: 4 processes, 400 agents, seed 42 (+ process index), cells agents-31838-1796158811607-<model> on 127.0.0.1:6497 (--redis) ==",
        "SIGTERM: forwarded to every member; waiting up to 20 s for them to stop, give their leases back and report (send it again to kill them)",
        "process  agents completed  other  steps  leases  queued lease p50 lease p99  local p50  local p99  real s",
        "0           100        26     74    182     183     232   100.06s   325.87s      0.00s      0.00s     1.6",
        "fleet       400        98    302    681     691     913   101.53s   359.11s      0.00s      0.00s     1.6",
        "(4 of 4 processes reported; other: jobs that did not complete; queued: leases that did not fit at once and took a ticket in the fleet's line; local: each process's own monitor, fleet row: the worst process; waits simulated)",
        "",
        "model     tokens ceiling   peak (events)  requests ceiling    peak  leases    queued lease p50 lease p99 lease max   held",
        "model-a            10416   10336 (10336)                 7   5 (5)      57       174   210.31s   385.15s   385.15s      0",
        "process 0's own report: /tmp/exp-term/fleet/member-0.out",
        "check: FAILED: the run was stopped by SIGTERM, forwarded to every member",
        "check: FAILED: process 0: monitor: interrupted (the fleet's parent forwarded SIGTERM)",
        "check: FAILED: process 0: monitor: 74 jobs were cancelled",
        "check: FAILED: process 3: monitor: interrupted (the fleet's parent forwarded SIGTERM)",
        "check: FAILED: process 3: monitor: 77 jobs were cancelled",
    ];

    fn parent_output(lines: &[&str]) -> ParentOutput {
        let mut out = ParentOutput::default();
        for line in lines {
            out.observe(line);
        }
        out
    }

    #[test]
    fn a_parents_private_server_is_read_from_its_line() {
        let line = "private redis-server: pid 28031, port 44847, directory /tmp/admission-redis-s6p6RP (stopped with this process, however it ends)";
        let private = PrivateServer {
            pid: 28_031,
            port: 44_847,
            dir: "/tmp/admission-redis-s6p6RP".to_owned(),
        };
        assert_eq!(PrivateServer::parse(line), Some(private.clone()));
        assert_eq!(
            parent_output(&[line, TERM_OUTPUT[0]]),
            ParentOutput {
                private: Some(private),
                fleet_started: true,
                ..ParentOutput::default()
            }
        );
        for bad in [
            "private redis-server: pid 0, port 1, directory /x",
            "private redis-server: pid x, port 1, directory /x",
            "private redis-server: pid 5, port 70000, directory /x",
            "private redis-server: pid 5, port 1, directory ",
            "a private redis-server: pid 5, port 1, directory /x",
        ] {
            assert_eq!(PrivateServer::parse(bad), None, "{bad}");
        }
        // This process is a redis-server neither, nor is a pid that does not exist.
        assert!(!server_runs(std::process::id()));
        assert!(!server_runs(u32::MAX));

        let private = PrivateServer::parse(line).unwrap();
        let mut found = Found::default();
        let gone = Gone {
            server: Some(Duration::from_millis(40)),
            dir: Some(Duration::from_millis(60)),
        };
        judge_gone(&private, gone, &mut found);
        assert_eq!(
            found.seen,
            [
                "the private redis-server (pid 28031) was gone 0.04 s after the parent's SIGKILL",
                "its directory /tmp/admission-redis-s6p6RP was removed 0.06 s after",
            ]
        );
        assert!(found.failures.is_empty());
        let mut found = Found::default();
        judge_gone(&private, Gone::default(), &mut found);
        assert_eq!(
            found.failures,
            [
                "the private redis-server (pid 28031) was still running 5 s after the parent's SIGKILL: SIGKILLed",
                "its directory /tmp/admission-redis-s6p6RP still existed 5 s after the parent's SIGKILL",
            ]
        );
    }

    #[test]
    fn a_parents_output_is_read_for_its_start_forwarding_tables_reports_and_verdict() {
        let out = parent_output(TERM_OUTPUT);
        assert_eq!(
            out,
            ParentOutput {
                private: None,
                fleet_started: true,
                forwarded: vec!["SIGTERM".to_owned()],
                process_table: true,
                model_table: true,
                reported: Some((4, 4)),
                check: TERM_OUTPUT[10..].iter().map(|l| l.to_string()).collect(),
            }
        );
        assert_eq!(parent_output(&[]), ParentOutput::default());
        // A line that merely starts like a header, or names no signal, is not one.
        let out = parent_output(&[
            "process 0's own report: /x",
            "model-a            10416",
            "the member: forwarded to every member",
            "(3 of 4 processes reported; ...)",
        ]);
        assert_eq!(
            out,
            ParentOutput {
                reported: Some((3, 4)),
                ..ParentOutput::default()
            }
        );
        assert_eq!(
            processes_reported("(12 of 16 processes reported; other: ...)"),
            Some((12, 16))
        );
        assert_eq!(processes_reported("(x of 4 processes reported"), None);
        assert_eq!(processes_reported("4 of 4 processes reported"), None);
        assert_eq!(processes_reported("(4 of 4 processes)"), None);
    }

    #[test]
    fn only_the_signals_own_check_lines_are_excused() {
        let check: Vec<String> = TERM_OUTPUT[10..].iter().map(|l| l.to_string()).collect();
        assert_eq!(
            SignalChecks::of(&check, "SIGTERM"),
            SignalChecks {
                passed: false,
                failed: 5,
                stopped: true,
                interrupted: 2,
                cancelled: 151,
                other: Vec::new(),
            }
        );
        // Another signal's lines are not this one's.
        let other = SignalChecks::of(&check, "SIGINT");
        assert_eq!(
            (other.stopped, other.interrupted, other.cancelled),
            (false, 0, 151)
        );
        assert_eq!(
            other.other,
            [check[0].clone(), check[1].clone(), check[3].clone()]
        );
    }

    #[test]
    fn any_other_check_line_fails_a_signalled_run() {
        let check: Vec<String> = [
            "check: FAILED: the run was stopped by SIGTERM, forwarded to every member",
            "check: FAILED: process 1: monitor: 3 jobs timed out",
            "check: FAILED: process 1: exited with exit status: 2 (see /x)",
            "check: FAILED: model-a: 1 leases (300 tokens, 1 requests) still held in the cell after the run",
            "check: FAILED: a member had not stopped 20 s after the forwarded signal and was killed",
            "check: FAILED: process x: monitor: 3 jobs were cancelled",
            "check: FAILED: process 2: chain: 3 jobs were cancelled",
            "check: FAILED: process 2: monitor: some jobs were cancelled",
            "check: something else",
            "check: passed (every process ran ...)",
        ]
        .map(str::to_owned)
        .to_vec();
        let sorted = SignalChecks::of(&check, "SIGTERM");
        assert_eq!(
            (
                sorted.passed,
                sorted.failed,
                sorted.stopped,
                sorted.interrupted,
                sorted.cancelled
            ),
            (true, 8, true, 0, 0)
        );
        assert_eq!(sorted.other, check[1..9].to_vec());
    }

    #[test]
    fn a_sigtermed_parent_passes_with_its_tables_its_reports_and_the_signals_own_verdict() {
        let out = parent_output(TERM_OUTPUT);
        let mut found = Found::default();
        judge_term(&out, Some(1), "SIGTERM", &mut found);
        assert_eq!(found.failures, Vec::<String>::new());
        assert_eq!(
            found.seen,
            [
                "the parent printed its tables (4 of 4 processes reported) and 5 `check:` lines, 5 of them the signal's own: stopped by SIGTERM: yes, members interrupted by it: 2, jobs cancelled: 151"
            ]
        );
        assert_eq!(found.lines().last().map(String::as_str), Some("passed"));

        // Exit 0 with FAILED lines, or 2, or a signal's death: each fails it.
        for code in [Some(0), Some(2), None] {
            let mut found = Found::default();
            judge_term(&out, code, "SIGTERM", &mut found);
            assert_eq!(
                found.failures,
                [format!(
                    "the parent exited with code {code:?}, not 1 as its verdict says"
                )]
            );
        }

        // No forwarding, no tables, a member missing, a held lease.
        let mut lines: Vec<&str> = TERM_OUTPUT
            .iter()
            .copied()
            .filter(|l| !l.starts_with("SIGTERM:") && !l.starts_with("model "))
            .collect();
        lines.push("(3 of 4 processes reported; ...)");
        lines.push("check: FAILED: model-a: 1 leases (300 tokens, 1 requests) still held in the cell after the run");
        let mut found = Found::default();
        judge_term(&parent_output(&lines), Some(1), "SIGTERM", &mut found);
        assert_eq!(
            found.failures,
            [
                "the parent never said it forwarded SIGTERM to its members",
                "the fleet's table was not printed (per-process header: true, per-model header: false)",
                "3 of 4 processes reported",
                "not the signal's doing: check: FAILED: model-a: 1 leases (300 tokens, 1 requests) still held in the cell after the run",
            ]
        );
        assert_eq!(
            found.lines().last().map(String::as_str),
            Some(
                "FAILED: not the signal's doing: check: FAILED: model-a: 1 leases (300 tokens, 1 requests) still held in the cell after the run"
            )
        );

        // Nothing printed after the start: no table, no report line, no verdict.
        let mut found = Found::default();
        judge_term(
            &parent_output(&TERM_OUTPUT[..2]),
            Some(1),
            "SIGTERM",
            &mut found,
        );
        assert_eq!(
            found.failures,
            [
                "the fleet's table was not printed (per-process header: false, per-model header: false)",
                "no `(R of N processes reported` line",
                "no verdict (`check:` line) printed",
            ]
        );

        // A run that passed its check although signalled (if the parent ever judges so) exits 0.
        let mut lines: Vec<&str> = TERM_OUTPUT[..10].to_vec();
        lines.push("check: passed (every process ran and passed its own check, ...)");
        let mut found = Found::default();
        judge_term(&parent_output(&lines), Some(0), "SIGTERM", &mut found);
        assert_eq!(found.failures, Vec::<String>::new());
        assert_eq!(
            found.seen,
            ["the parent printed its tables (4 of 4 processes reported) and `check: passed`"]
        );
    }

    #[test]
    fn a_members_report_says_whether_it_was_interrupted() {
        let report = r#"fleet-member-report: {"member":0,"jobs":100,"problems":["monitor: interrupted (the fleet's parent went away (its pipe closed))","monitor: 74 jobs were cancelled"],"ends":[]}"#;
        let stdout = format!("== monitor ==\n{report}\nwrote /x/summary.json\n");
        assert_eq!(
            member_interrupted(&stdout),
            Ok(Some(
                "monitor: interrupted (the fleet's parent went away (its pipe closed))".to_owned()
            ))
        );
        assert_eq!(
            member_interrupted(r#"fleet-member-report: {"member":1,"problems":[]}"#),
            Ok(None)
        );
        assert_eq!(
            member_interrupted("== monitor ==\n"),
            Err("no report line in its output".to_owned())
        );
        assert_eq!(
            member_interrupted(r#"fleet-member-report: {"member":1}"#),
            Err("its report has no `problems` list".to_owned())
        );
        assert!(
            member_interrupted("fleet-member-report: {not json")
                .unwrap_err()
                .starts_with("its report line is not JSON: ")
        );
    }

    #[test]
    fn fleet_members_are_told_by_their_command_line() {
        let raw = b"/w/target/release/examples/agents\0--fleet\x004\0--fleet-member\x002\0--redis\x00127.0.0.1:40123\0--cell\0agents-9-1\0--out-dir\0/w/target/agents/chaos/kill-parent/fleet/member-2\0";
        let args = cmdline_args(raw);
        assert_eq!(
            args,
            [
                "/w/target/release/examples/agents",
                "--fleet",
                "4",
                "--fleet-member",
                "2",
                "--redis",
                "127.0.0.1:40123",
                "--cell",
                "agents-9-1",
                "--out-dir",
                "/w/target/agents/chaos/kill-parent/fleet/member-2",
            ]
        );
        let dir = "/w/target/agents/chaos/kill-parent";
        assert!(is_fleet_member(&args, "127.0.0.1:40123", dir));
        // Another run's server, another run's directory, or the parent itself: not a member.
        assert!(!is_fleet_member(&args, "127.0.0.1:40124", dir));
        assert!(!is_fleet_member(
            &args,
            "127.0.0.1:40123",
            "/w/target/agents/chaos/kill"
        ));
        let parent = cmdline_args(
            b"/w/agents\0--fleet\x004\0--redis\x00127.0.0.1:40123\0--out-dir\0/w/target/agents/chaos/kill-parent\0",
        );
        assert!(!is_fleet_member(&parent, "127.0.0.1:40123", dir));
        assert_eq!(cmdline_args(b""), Vec::<String>::new());
        // This process is no member, and a pid that does not exist is no zombie.
        assert!(running_members("127.0.0.1:1", "/nowhere").is_empty());
        assert!(!is_zombie(u32::MAX));
    }

    #[test]
    fn the_servers_port_is_read_from_its_url() {
        assert_eq!(redis_port("redis://127.0.0.1:40123/"), Some(40123));
        assert_eq!(redis_port("redis://127.0.0.1:6379"), Some(6379));
        assert_eq!(redis_port("redis://127.0.0.1/"), None);
        assert_eq!(
            redis_port("postgres://postgres@127.0.0.1:5432/postgres"),
            None
        );
    }

    #[test]
    fn cells_and_what_they_hold_are_read_from_redis_clis_replies() {
        let scan = "admission:{agents-9-1-model-a}:occ\nadmission:{agents-9-1-model-a}:events\n\
                    admission:{agents-9-1-model-b}:cfg\nadmission:{agents-9-1-model-a}:cfg\n\
                    other:key\nplain\n";
        assert_eq!(
            cells_in(scan).into_iter().collect::<Vec<_>>(),
            [
                "admission:{agents-9-1-model-a}",
                "admission:{agents-9-1-model-b}"
            ]
        );
        assert!(cells_in("").is_empty());

        assert_eq!(counts("0\n", 1).unwrap(), [0]);
        assert_eq!(counts("3\n", 1).unwrap(), [3]);
        // HMGET of absent fields: nils, each an empty line.
        assert_eq!(counts("\n\n", 2).unwrap(), [0, 0]);
        assert_eq!(counts("2\n\n", 2).unwrap(), [2, 0]);
        assert_eq!(counts("-1\n", 1).unwrap(), [-1]);
        assert!(counts("ERR unknown command\n", 1).is_err());
        assert!(counts("1\n", 2).is_err());
        assert!(counts("", 1).is_err());

        assert_eq!(records("seq\ntok\ntick\n"), (0, 0));
        assert_eq!(records("seq\nr:m0-a\nq:m1-b\nr:m2-c\nsb\n"), (2, 1));
        assert_eq!(records(""), (0, 0));

        assert_eq!(Held::default().describe(), None);
        let held = Held {
            leases: 2,
            transfers: 2,
            bytes: 600,
            lease_records: 2,
            ..Held::default()
        };
        assert_eq!(
            held.describe().as_deref(),
            Some(
                "held: 2 leases in exp, 2 transfers in flight (occ st), 600 bytes in flight (occ sb), 2 lease records (occ r:)"
            )
        );
        let waiting = Held {
            waiting: 1,
            live: 1,
            waiter_records: 1,
            transfers: -1,
            ..Held::default()
        };
        assert_eq!(
            waiting.describe().as_deref(),
            Some(
                "held: 1 tickets in line, 1 tickets in live, -1 transfers in flight (occ st), 1 waiter records (occ q:)"
            )
        );
    }

    #[test]
    fn the_fault_runs_are_bounded_and_the_failover_is_one_of_them() {
        assert_eq!(
            FAULTS,
            [
                "restart",
                "restart-fsync",
                "pause",
                "kill-member",
                "kill-master",
                "failover"
            ]
        );
        // Each fault run is bounded, the longest outage (a failover's, about 12.5 s, after
        // 2 s of cluster start) and the run's own timeout well inside it.
        assert!(RUN_LIMIT >= Duration::from_secs(30));
        let timeout = RUN_ARGS
            .iter()
            .position(|a| *a == "--run-timeout")
            .and_then(|i| RUN_ARGS[i + 1].parse::<u64>().ok())
            .expect("a --run-timeout");
        assert!(Duration::from_secs(timeout) < RUN_LIMIT);
    }

    #[test]
    fn the_fleet_size_is_the_one_the_runs_ask_for() {
        assert_eq!(RUN_ARGS[..2], ["--fleet", FLEET.to_string().as_str()]);
        assert_eq!(
            SIGNAL_RUNS.map(|r| (r.name, r.signal_name(), r.private)),
            [
                ("term-parent", "SIGTERM".to_owned(), false),
                ("kill-parent", "SIGKILL".to_owned(), true)
            ]
        );
    }
}
