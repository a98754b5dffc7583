//! `cargo xtask chaos`: the agents fleet through three real faults, one run each.
//!
//! Each run is `agents --fleet 4 --time-scale 300 --admit-timeout 3600 --check --chaos FAULT`
//! (see `examples/agents/chaos.rs`): the fleet's parent injects the fault itself, one second of
//! real time after its members started, on its private `redis-server`, so the fault lands at the
//! same point of every run and is over in bounded time:
//!
//! | fault         | what the parent does                                                   |
//! |---------------|------------------------------------------------------------------------|
//! | `restart`     | SIGKILLs the server and starts it again on its port 2 s later (AOF on) |
//! | `pause`       | sends `CLIENT PAUSE 3000`                                              |
//! | `kill-member` | SIGKILLs the last member; its leases stay held until their TTL (10 s)  |
//!
//! A run passes when it prints `check: passed` and exits 0: every job ended, none failed but
//! those whose own deadline fell inside the outage (the run prints how many failed and how many
//! of those), no ceiling was exceeded, and nothing was held in Redis at the end. A lease wait
//! lasts 12 s of real time (`--admit-timeout 3600` at the scale of 300), longer than every
//! outage (2 s, 3 s, and the 10 s TTL of a killed member's leases and tickets): a job waiting
//! through one has time left after it, so a fleet that recovers fails no job at all. Every run is made
//! and its verdict printed even when an earlier one failed; the step fails if any did. The example
//! is built once (`cargo build --release --example agents`) and its binary run directly, so that
//! a run that outlives [`RUN_LIMIT`] can be stopped by its own pid: SIGTERM first (the parent
//! forwards it to its members, which give their leases back, and still prints its verdict), then
//! SIGKILL. The three runs take about 30 s on a 2-core machine; [`RUN_LIMIT`] and [`STOP_GRACE`]
//! bound each at 45 s, so the step at about two minutes.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::services;
use crate::step::Workspace;

/// The faults, in the order they run.
pub(crate) const FAULTS: [&str; 3] = ["restart", "pause", "kill-member"];

/// Every run's flags before `--chaos FAULT`: four processes, a simulated minute in 0.2 s (a run
/// is about 4 s without a fault), lease waits of 12 s real, and members cancelled after 25 s of
/// real time whatever happens.
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

/// What one run printed and how it ended.
#[derive(Debug, Default, PartialEq, Eq)]
struct Verdict {
    /// `chaos: ...` lines: the outage and the failed jobs judged against it.
    chaos: Vec<String>,
    /// `check: ...` lines: the verdict.
    check: Vec<String>,
}

impl Verdict {
    /// Keeps `line` if it is part of the verdict.
    fn observe(&mut self, line: &str) {
        let line = line.trim_end();
        if line.starts_with("chaos: jobs failed:") || line.starts_with("chaos: FAILED") {
            self.chaos.push(line.to_owned());
        } else if line.starts_with("check: ") {
            self.check.push(line.to_owned());
        }
    }

    /// Whether the run said it passed, and only that.
    fn passed(&self) -> bool {
        matches!(self.check.as_slice(), [only] if only.starts_with("check: passed"))
    }
}

/// Runs the three faults; fails unless every run passed.
pub(crate) fn run(ws: &Workspace) -> Result<ExitCode> {
    let started = Instant::now();
    let exe = build_agents(ws)?;
    let target = exe
        .ancestors()
        .nth(3)
        .map_or_else(|| ws.root.join("target"), Path::to_path_buf);
    let mut outcomes = Vec::new();
    for (index, fault) in FAULTS.iter().enumerate() {
        let out_dir = target.join("agents").join("chaos").join(fault);
        let mut args: Vec<String> = RUN_ARGS.iter().map(|a| a.to_string()).collect();
        args.extend(["--chaos".to_owned(), fault.to_string()]);
        args.extend(["--out-dir".to_owned(), out_dir.display().to_string()]);
        println!(
            "==> chaos [{}/{}] {fault}: {} {}",
            index + 1,
            FAULTS.len(),
            exe.display(),
            args.join(" ")
        );
        let _ = std::io::stdout().flush();
        let run_started = Instant::now();
        let (ok, verdict) = run_one(&exe, &args, &ws.root)?;
        outcomes.push((fault, run_started.elapsed().as_secs_f64(), ok, verdict));
    }

    println!("==> chaos summary");
    let mut failed = Vec::new();
    for (fault, seconds, ok, verdict) in &outcomes {
        let passed = *ok && verdict.passed();
        println!(
            "    {fault:<12} {seconds:>6.1}s  {}",
            if passed { "ok" } else { "FAILED" }
        );
        for line in verdict.chaos.iter().chain(&verdict.check) {
            println!("        {line}");
        }
        if verdict.check.is_empty() {
            println!("        (no verdict printed)");
        }
        if !passed {
            failed.push(**fault);
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

/// `cargo build --release --example agents`; the binary's path, as cargo reports it.
fn build_agents(ws: &Workspace) -> Result<PathBuf> {
    println!("==> chaos: cargo build --release --example agents");
    let output = Command::new(&ws.cargo)
        .args([
            "build",
            "--release",
            "--example",
            "agents",
            "--message-format=json-render-diagnostics",
        ])
        .current_dir(&ws.root)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .context("could not run cargo build")?;
    if !output.status.success() {
        bail!(
            "cargo build --release --example agents failed ({})",
            output.status
        );
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(agents_executable)
        .context("cargo build did not report the agents example's executable")
}

/// The executable of the `agents` example in one line of cargo's JSON messages.
fn agents_executable(line: &str) -> Option<PathBuf> {
    let message: serde_json::Value = serde_json::from_str(line).ok()?;
    if message["reason"] != "compiler-artifact" || message["target"]["name"] != "agents" {
        return None;
    }
    message["executable"].as_str().map(PathBuf::from)
}

/// Runs the agents example once with `args`, its output shown as it comes and its verdict kept;
/// stopped by its pid after [`RUN_LIMIT`]. Whether it exited 0, and its verdict.
fn run_one(exe: &Path, args: &[String], root: &Path) -> Result<(bool, Verdict)> {
    let mut child = Command::new(exe)
        .args(args)
        .current_dir(root)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("could not start {}", exe.display()))?;
    let stdout = child.stdout.take().context("the run's stdout")?;
    let reader = thread::spawn(move || {
        let mut verdict = Verdict::default();
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            println!("{line}");
            verdict.observe(&line);
        }
        verdict
    });
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verdict_is_the_chaos_and_check_lines() {
        let mut verdict = Verdict::default();
        for line in [
            "== fleet: 4 processes ==",
            "chaos: restart at +1.00 s after the members started",
            "chaos: jobs failed: 3 (3 timed out, 0 failed); 3 with their own deadline inside the outage, 0 not",
            "check: passed (the fault was injected, ...)\n",
        ] {
            verdict.observe(line);
        }
        assert_eq!(
            verdict.chaos,
            [
                "chaos: jobs failed: 3 (3 timed out, 0 failed); 3 with their own deadline inside the outage, 0 not"
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
    }

    #[test]
    fn the_agents_executable_is_read_from_cargos_messages() {
        let artifact = r#"{"reason":"compiler-artifact","target":{"name":"agents","kind":["example"]},"executable":"/w/target/release/examples/agents"}"#;
        assert_eq!(
            agents_executable(artifact),
            Some(PathBuf::from("/w/target/release/examples/agents"))
        );
        let other =
            r#"{"reason":"compiler-artifact","target":{"name":"axum"},"executable":"/w/x"}"#;
        assert_eq!(agents_executable(other), None);
        assert_eq!(
            agents_executable(r#"{"reason":"build-finished","success":true}"#),
            None
        );
        assert_eq!(agents_executable("not json"), None);
    }
}
