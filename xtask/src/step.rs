//! Steps and the plan runner: each step is one cargo command (or one command of this xtask, run
//! as its own process), echoed before it runs and timed.
//!
//! A plan runs its steps in order and stops at the first failure. Steps that run tests have
//! their output teed (shown as it arrives and scanned for the harness summary lines, see
//! [`crate::count`]); the other steps inherit the terminal. Steps marked `services` run with the
//! services of [`crate::services::REQUIRED`] up, started before the first such step and stopped
//! right after the last one, or on the way out if a step fails.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::io::{self, BufRead, BufReader, IsTerminal, Read, Write};
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::thread;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::count::{Format, Tally};
use crate::services;

/// Where cargo runs and which cargo it is.
pub(crate) struct Workspace {
    /// The workspace root: the parent of the xtask crate's manifest directory.
    pub(crate) root: PathBuf,
    /// `$CARGO` (set by `cargo run`), else `cargo` from `PATH`.
    pub(crate) cargo: OsString,
}

impl Workspace {
    /// Finds the workspace root from `CARGO_MANIFEST_DIR` (at run time if cargo set it, else as
    /// compiled in).
    pub(crate) fn locate() -> Result<Self> {
        let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
        let root = manifest_dir
            .parent()
            .with_context(|| format!("{} has no parent directory", manifest_dir.display()))?
            .to_path_buf();
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        Ok(Self { root, cargo })
    }

    /// Whether `cargo nextest --version` works.
    /// The workspace's packages, by name (`cargo metadata --no-deps`).
    pub(crate) fn members(&self) -> Result<Vec<String>> {
        let output = Command::new(&self.cargo)
            .args(["metadata", "--no-deps", "--format-version", "1"])
            .current_dir(&self.root)
            .stderr(Stdio::inherit())
            .output()
            .context("could not run cargo metadata")?;
        if !output.status.success() {
            anyhow::bail!("cargo metadata failed ({})", output.status);
        }
        let metadata: serde_json::Value =
            serde_json::from_slice(&output.stdout).context("cargo metadata's output")?;
        Ok(metadata["packages"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["name"].as_str().map(str::to_owned))
            .collect())
    }

    pub(crate) fn has_nextest(&self) -> bool {
        Command::new(&self.cargo)
            .args(["nextest", "--version"])
            .current_dir(&self.root)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}

/// One command of a plan.
pub(crate) struct Step {
    /// Short name shown in the step line and the summary.
    pub(crate) name: &'static str,
    /// The arguments, after `cargo`.
    pub(crate) args: Vec<String>,
    /// Extra environment variables, shown before the command.
    pub(crate) env: Vec<(&'static str, String)>,
    /// Tee the output and count the tests it reports in this harness's format.
    pub(crate) counts_tests: Option<Format>,
    /// Run with these services up (none: with none).
    pub(crate) services: Vec<services::Service>,
    /// The arguments are this xtask's (`cargo xtask ARGS...`), run by this very binary.
    pub(crate) xtask: bool,
    /// The arguments are this program's (a binary an earlier step built), run from the root.
    pub(crate) program: Option<PathBuf>,
}

impl Step {
    /// `cargo ARGS...`, no extra environment, output not counted.
    pub(crate) fn cargo(name: &'static str, args: &[&str]) -> Self {
        Self {
            name,
            args: args.iter().map(|a| a.to_string()).collect(),
            env: Vec::new(),
            counts_tests: None,
            services: Vec::new(),
            xtask: false,
            program: None,
        }
    }

    /// `cargo xtask ARGS...`, run as a process of this binary.
    pub(crate) fn xtask(name: &'static str, args: &[&str]) -> Self {
        Self {
            xtask: true,
            ..Self::cargo(name, args)
        }
    }

    /// `PROGRAM ARGS...`: a binary an earlier step built, run from the workspace root.
    pub(crate) fn program(name: &'static str, program: PathBuf, args: &[&str]) -> Self {
        Self {
            program: Some(program),
            ..Self::cargo(name, args)
        }
    }

    /// Marks the step as one that runs tests: its output is teed and counted as `format`.
    pub(crate) fn counting_tests(mut self, format: Format) -> Self {
        self.counts_tests = Some(format);
        self
    }

    /// Marks the step as one that runs with `services` up.
    pub(crate) fn with_services(mut self, services: &[services::Service]) -> Self {
        self.services = services.to_vec();
        self
    }

    /// Adds an environment variable.
    pub(crate) fn env(mut self, key: &'static str, value: impl Into<String>) -> Self {
        self.env.push((key, value.into()));
        self
    }

    /// Appends arguments.
    pub(crate) fn args(mut self, args: impl IntoIterator<Item = String>) -> Self {
        self.args.extend(args);
        self
    }

    /// The command as a shell line: `KEY=value ... cargo arg ...`.
    fn display(&self) -> String {
        let mut line = String::new();
        for (key, value) in &self.env {
            let _ = write!(line, "{key}={} ", shell_quote(value));
        }
        match &self.program {
            Some(program) => line.push_str(&shell_quote(&program.display().to_string())),
            None if self.xtask => line.push_str("cargo xtask"),
            None => line.push_str("cargo"),
        }
        for arg in &self.args {
            line.push(' ');
            line.push_str(&shell_quote(arg));
        }
        line
    }

    /// Runs the step from the workspace root with `extra_env` added.
    fn execute(
        &self,
        ws: &Workspace,
        extra_env: &[(&'static str, String)],
    ) -> Result<(ExitStatus, Tally)> {
        let mut cmd = if let Some(program) = &self.program {
            Command::new(program)
        } else if self.xtask {
            Command::new(std::env::current_exe().context("finding the xtask's own path")?)
        } else {
            Command::new(&ws.cargo)
        };
        cmd.args(&self.args)
            .current_dir(&ws.root)
            .stdin(Stdio::null());
        for (key, value) in self.env.iter().chain(extra_env) {
            cmd.env(key, value);
        }
        let spawn_error = || format!("could not start `{}`", self.display());
        let Some(format) = self.counts_tests else {
            let status = cmd.status().with_context(spawn_error)?;
            return Ok((status, Tally::default()));
        };

        // Keep cargo's colours when a person is watching; the counter strips them.
        if io::stdout().is_terminal() && std::env::var_os("CARGO_TERM_COLOR").is_none() {
            cmd.env("CARGO_TERM_COLOR", "always");
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(spawn_error)?;
        let stdout = child.stdout.take().context("child stdout")?;
        let stderr = child.stderr.take().context("child stderr")?;
        let out = thread::spawn(move || tee(format, stdout, io::stdout()));
        let err = thread::spawn(move || tee(format, stderr, io::stderr()));
        let status = child.wait().with_context(spawn_error)?;
        let mut tally = out.join().expect("stdout tee panicked");
        tally.add(err.join().expect("stderr tee panicked"));
        Ok((status, tally))
    }
}

/// Copies `from` to `to` line by line as it arrives, counting the tests reported on the way.
fn tee(format: Format, from: impl Read, mut to: impl Write) -> Tally {
    let mut reader = BufReader::new(from);
    let mut tally = Tally::default();
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                let _ = to.write_all(&line).and_then(|()| to.flush());
                tally.observe(format, &String::from_utf8_lossy(&line));
            }
        }
    }
    tally
}

/// Quotes `s` for a POSIX shell if it needs it.
fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@+%".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The outcome of one step that ran.
struct Outcome {
    name: &'static str,
    seconds: f64,
    ok: bool,
    /// `None` for steps that do not run tests or whose output held no count.
    tally: Option<Tally>,
}

/// What a successful plan reports.
pub(crate) struct Report {
    /// Tests passed, summed over the steps whose counts could be read.
    pub(crate) passed: u64,
    /// Tests not run: ignored, or left out by the runner's profile.
    pub(crate) skipped: u64,
    /// Whether any step ran tests (only then is the `xtask: N passed` line meaningful).
    pub(crate) ran_tests: bool,
}

/// Runs `steps` in order, stopping at the first failure; prints a summary either way.
pub(crate) fn run_plan(ws: &Workspace, steps: &[Step]) -> Result<Report> {
    let started = Instant::now();
    let mut outcomes = Vec::new();
    let result = run_steps(ws, steps, &mut outcomes);
    print_summary(&outcomes, started.elapsed().as_secs_f64());
    result?;
    Ok(Report {
        passed: outcomes
            .iter()
            .filter_map(|o| o.tally)
            .map(|t| t.passed)
            .sum(),
        skipped: outcomes
            .iter()
            .filter_map(|o| o.tally)
            .map(|t| t.skipped)
            .sum(),
        ran_tests: steps.iter().any(|s| s.counts_tests.is_some()),
    })
}

fn run_steps(ws: &Workspace, steps: &[Step], outcomes: &mut Vec<Outcome>) -> Result<()> {
    // Dropping this on an early return stops the services too.
    let mut running: Option<services::Running> = None;
    let total = steps.len();
    for (index, step) in steps.iter().enumerate() {
        // Consecutive steps that need the same services share them.
        if running
            .as_ref()
            .is_some_and(|up| up.services() != step.services.as_slice())
            && let Some(up) = running.take()
        {
            stop_services(up)?;
        }
        if !step.services.is_empty() && running.is_none() {
            running = Some(start_services(&step.services)?);
        }
        let extra_env = running
            .as_ref()
            .map(services::Running::env)
            .unwrap_or_default();

        let number = index + 1;
        let command = step.display();
        println!("==> [{number}/{total}] {}: {command}", step.name);
        let _ = io::stdout().flush();
        let started = Instant::now();
        let (status, tally) = step.execute(ws, &extra_env)?;
        let seconds = started.elapsed().as_secs_f64();
        let tally = (tally.lines > 0).then_some(tally);
        outcomes.push(Outcome {
            name: step.name,
            seconds,
            ok: status.success(),
            tally,
        });
        if !status.success() {
            bail!(
                "step [{number}/{total}] {} failed ({status}) after {seconds:.1}s: {command}",
                step.name
            );
        }
        if step.counts_tests.is_some() && tally.is_none() {
            println!(
                "==> {}: no test counts found in the output; not counted",
                step.name
            );
        }
    }
    if let Some(up) = running.take() {
        stop_services(up)?;
    }
    Ok(())
}

fn start_services(needed: &[services::Service]) -> Result<services::Running> {
    let started = Instant::now();
    let running = services::start(needed).context("services")?;
    println!(
        "==> services: up in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(running)
}

fn stop_services(running: services::Running) -> Result<()> {
    if running.is_empty() {
        return Ok(());
    }
    let started = Instant::now();
    running.stop().context("services")?;
    println!(
        "==> services: stopped in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn print_summary(outcomes: &[Outcome], total_seconds: f64) {
    if outcomes.is_empty() {
        return;
    }
    println!("==> summary");
    for outcome in outcomes {
        let status = if outcome.ok { "ok" } else { "FAILED" };
        let tests = match outcome.tally {
            Some(t) if t.failed > 0 => format!(" ({} passed, {} failed)", t.passed, t.failed),
            Some(t) if t.skipped > 0 => format!(" ({} passed, {} skipped)", t.passed, t.skipped),
            Some(t) => format!(" ({} passed)", t.passed),
            None => String::new(),
        };
        println!(
            "    {:<10} {:>8.1}s  {status}{tests}",
            outcome.name, outcome.seconds
        );
    }
    println!("    {:<10} {:>8.1}s", "total", total_seconds);
    let _ = io::stdout().flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_line_shows_env_and_quotes_only_what_needs_it() {
        let step = Step::cargo("loom", &["test", "-p", "admission-core", "--", "loom"])
            .env("RUSTFLAGS", "--cfg admission_loom")
            .env("LOOM_MAX_PREEMPTIONS", "2");
        assert_eq!(
            step.display(),
            "RUSTFLAGS='--cfg admission_loom' LOOM_MAX_PREEMPTIONS=2 cargo test -p admission-core -- loom"
        );
    }

    #[test]
    fn an_xtask_step_shows_as_cargo_xtask() {
        assert_eq!(
            Step::xtask("chaos", &["chaos"]).display(),
            "cargo xtask chaos"
        );
    }

    #[test]
    fn single_quotes_are_escaped() {
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }

    #[test]
    fn tee_copies_every_byte_and_counts() {
        let input = "running 1 test\ntest result: ok. 1 passed; 0 failed; 0 ignored\nno newline";
        let mut copy = Vec::new();
        let tally = tee(Format::Libtest, input.as_bytes(), &mut copy);
        assert_eq!(copy, input.as_bytes());
        assert_eq!((tally.passed, tally.failed, tally.lines), (1, 0, 1));
    }
}
