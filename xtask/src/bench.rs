//! `cargo xtask bench`: runs the side-by-side benchmarks (`benches/`, package `admission-benches`)
//! and rewrites their table in BENCHMARKS.md, between [`BEGIN`] and [`END`].
//!
//! The figures come from what the benches leave under the target directory:
//! - criterion's `criterion/<group>/<bench>/new/estimates.json` (`median.point_estimate`, ns);
//! - the custom harness's `side-by-side/<part>.json` (flat objects of numbers).
//!
//! A run also writes `side-by-side/run.json`: when it started, the commit, the load average
//! before it, the toolchain and how long it took; the table's header line comes from there, with
//! the machine's mode (fast or slow) as a peer's figure in the same run shows it. A figure whose
//! file is older than the recorded run's start is marked as left over from an earlier run.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::step::{self, Step, Workspace};

/// The line before the generated table in BENCHMARKS.md.
const BEGIN: &str = "<!-- side-by-side:begin -->";
/// The line after it.
const END: &str = "<!-- side-by-side:end -->";

/// What `cargo xtask bench` runs by default: the three targets the table reads.
const DEFAULT_RUN: &[&str] = &[
    "bench",
    "-p",
    "admission-benches",
    "--bench",
    "side_by_side",
    "--bench",
    "scarce_and_wakes",
    "--bench",
    "waiter_memory",
];
/// What `cargo xtask bench --all` runs: every bench of the workspace, all of which live in
/// `admission-benches` (the side-by-side ones too).
const ALL_RUN: &[&str] = &["bench", "-p", "admission-benches"];

/// Options of `cargo xtask bench`.
struct Options {
    /// `--all`: every bench target of `admission-benches`, not only the side-by-side ones.
    all: bool,
    /// `--report-only`: rewrite the table from the results on disk without running anything.
    report_only: bool,
    /// Everything else, passed to `cargo bench` (e.g. `-- single_limit`).
    rest: Vec<String>,
}

fn parse(args: &[String]) -> Options {
    let mut options = Options {
        all: false,
        report_only: false,
        rest: Vec::new(),
    };
    for arg in args {
        match arg.as_str() {
            "--all" if options.rest.is_empty() => options.all = true,
            "--report-only" if options.rest.is_empty() => options.report_only = true,
            _ => options.rest.push(arg.clone()),
        }
    }
    options
}

/// `cargo xtask bench [--all] [--report-only] [cargo bench args...]`.
pub(crate) fn run(ws: &Workspace, args: &[String]) -> Result<ExitCode> {
    let options = parse(args);
    let target = target_dir(ws)?;
    let results = target.join("side-by-side");
    let run_file = results.join("run.json");
    if !options.report_only {
        let base = if options.all { ALL_RUN } else { DEFAULT_RUN };
        let bench = Step::cargo("bench", base).args(options.rest.iter().cloned());
        let mut command = format!("cargo {}", base.join(" "));
        for arg in &options.rest {
            command.push(' ');
            command.push_str(arg);
        }
        let mut run = RunInfo::before(ws, command);
        let started = Instant::now();
        step::run_plan(ws, &[bench])?;
        run.seconds = started.elapsed().as_secs();
        std::fs::create_dir_all(&results)
            .with_context(|| format!("could not create {}", results.display()))?;
        std::fs::write(&run_file, run.to_json())
            .with_context(|| format!("could not write {}", run_file.display()))?;
    }
    let run = match std::fs::read_to_string(&run_file) {
        Ok(text) => Some(RunInfo::from_json(&text)?),
        Err(_) => None,
    };
    let sources = Sources {
        target,
        since: run.as_ref().map(|r| r.started_unix),
    };
    let table = render(&sources, run.as_ref());
    let path = ws.root.join("BENCHMARKS.md");
    let doc = std::fs::read_to_string(&path)
        .with_context(|| format!("could not read {}", path.display()))?;
    let doc = splice(&doc, &table)?;
    std::fs::write(&path, doc).with_context(|| format!("could not write {}", path.display()))?;
    println!("{table}");
    println!(
        "==> bench: the side-by-side table in {} is rewritten",
        path.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// `$CARGO_TARGET_DIR` (made absolute) or `target/` at the workspace root.
pub(crate) fn target_dir(ws: &Workspace) -> Result<PathBuf> {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => std::path::absolute(Path::new(&dir))
            .with_context(|| format!("could not resolve {dir:?}")),
        None => Ok(ws.root.join("target")),
    }
}

/// Replaces what lies between the markers, or puts a marked section after the document's title.
fn splice(doc: &str, table: &str) -> Result<String> {
    let block = format!("{BEGIN}\n{table}{END}");
    match (doc.find(BEGIN), doc.find(END)) {
        (Some(begin), Some(end)) if begin < end => Ok(format!(
            "{}{block}{}",
            &doc[..begin],
            &doc[end + END.len()..]
        )),
        (None, None) => {
            let after_title = doc
                .find("\n\n")
                .filter(|_| doc.starts_with("# "))
                .map_or(0, |i| i + 2);
            Ok(format!(
                "{}## Side by side (`cargo xtask bench`)\n\n{block}\n\n{}",
                &doc[..after_title],
                &doc[after_title..]
            ))
        }
        _ => {
            bail!("BENCHMARKS.md has one of `{BEGIN}` / `{END}` without the other, or out of order")
        }
    }
}

// ------------------------------------------------------------------------------------------------
// The run's provenance

/// What a run records about itself.
struct RunInfo {
    started_unix: u64,
    command: String,
    commit: String,
    load: String,
    rustc: String,
    cpus: usize,
    seconds: u64,
}

impl RunInfo {
    fn before(ws: &Workspace, command: String) -> RunInfo {
        let started_unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let head = capture(ws, "git", &["rev-parse", "--short", "HEAD"]);
        let dirty = capture(ws, "git", &["status", "--porcelain"]);
        let commit = match (head, dirty) {
            (Some(head), Some(dirty)) if dirty.is_empty() => head,
            (Some(head), Some(_)) => format!("{head} with uncommitted changes"),
            (Some(head), None) => head,
            (None, _) => "unknown".to_owned(),
        };
        let load = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|l| l.split_whitespace().next().map(str::to_owned))
            .unwrap_or_else(|| "unknown".to_owned());
        RunInfo {
            started_unix,
            command,
            commit,
            load,
            rustc: capture(ws, "rustc", &["--version"]).unwrap_or_else(|| "unknown".to_owned()),
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            seconds: 0,
        }
    }

    fn to_json(&self) -> String {
        let value = serde_json::json!({
            "started_unix": self.started_unix,
            "command": self.command,
            "commit": self.commit,
            "load_1m_before": self.load,
            "rustc": self.rustc,
            "cpus": self.cpus,
            "seconds": self.seconds,
        });
        format!("{value:#}\n")
    }

    fn from_json(text: &str) -> Result<RunInfo> {
        let value: Value = serde_json::from_str(text).context("run.json is not JSON")?;
        let text = |key: &str| value[key].as_str().unwrap_or("unknown").to_owned();
        let number = |key: &str| value[key].as_u64().unwrap_or(0);
        Ok(RunInfo {
            started_unix: number("started_unix"),
            command: text("command"),
            commit: text("commit"),
            load: text("load_1m_before"),
            rustc: text("rustc"),
            cpus: usize::try_from(number("cpus")).unwrap_or(0),
            seconds: number("seconds"),
        })
    }
}

/// A command's trimmed standard output, `None` when it cannot run or fails.
fn capture(ws: &Workspace, program: &str, args: &[&str]) -> Option<String> {
    let output = Command::new(program)
        .args(args)
        .current_dir(&ws.root)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// `YYYY-MM-DD HH:MM UTC` for seconds since the Unix epoch (Hinnant's civil-from-days).
fn utc(unix: u64) -> String {
    let days = i64::try_from(unix / 86_400).unwrap_or(0);
    let secs = unix % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02} UTC",
        secs / 3_600,
        secs % 3_600 / 60
    )
}

// ------------------------------------------------------------------------------------------------
// Reading the figures

/// Where a figure is read from.
#[derive(Clone, Copy)]
enum Src {
    /// Criterion's median for `group/bench`, in nanoseconds.
    Criterion(&'static str, &'static str),
    /// A number in `side-by-side/<part>.json`, multiplied by the factor (1000 turns the
    /// harness's microseconds into nanoseconds).
    Harness(&'static str, &'static str, f64),
    /// No figure: a row with no peer.
    Nothing,
}

/// A figure and whether its file predates the recorded run.
struct Figure {
    value: f64,
    stale: bool,
}

struct Sources {
    target: PathBuf,
    /// The recorded run's start: files older than this are stale.
    since: Option<u64>,
}

impl Sources {
    fn read(&self, src: Src) -> Option<Figure> {
        let (path, pointer, factor) = match src {
            Src::Criterion(group, bench) => (
                self.target
                    .join("criterion")
                    .join(group)
                    .join(bench)
                    .join("new")
                    .join("estimates.json"),
                "/median/point_estimate".to_owned(),
                1.0,
            ),
            Src::Harness(part, key, factor) => (
                self.target
                    .join("side-by-side")
                    .join(format!("{part}.json")),
                format!("/{key}"),
                factor,
            ),
            Src::Nothing => return None,
        };
        let text = std::fs::read_to_string(&path).ok()?;
        let value: Value = serde_json::from_str(&text).ok()?;
        let number = value.pointer(&pointer)?.as_f64()? * factor;
        let modified = std::fs::metadata(&path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs());
        Some(Figure {
            value: number,
            stale: self.since.is_some_and(|since| modified < since),
        })
    }
}

// ------------------------------------------------------------------------------------------------
// The table

/// What a row's figures count.
#[derive(Clone, Copy)]
enum Unit {
    /// Nanoseconds, shown as ns/us/ms/s.
    Time,
    /// Completed calls per second.
    PerSecond,
    /// Tokens.
    Tokens,
    /// A mean number of permits.
    Permits,
    /// Heap bytes.
    Bytes,
    /// A count of events (context switches).
    Count,
}

/// The goal a row is judged against.
#[derive(Clone, Copy)]
enum Goal {
    /// No goal: shown for context.
    None,
    /// ours/peer must be at most this.
    RatioAtMost(f64),
    /// ours/peer must be at least this.
    RatioAtLeast(f64),
    /// ours must be zero.
    OursZero,
    /// ours must be below this many nanoseconds.
    OursBelow(f64),
    /// ours must be at most this many bytes.
    BytesAtMost(f64),
}

struct Row {
    item: &'static str,
    what: &'static str,
    unit: Unit,
    ours: Src,
    peer: Src,
    goal: Goal,
    command: &'static str,
}

const SIDE: &str = "cargo bench -p admission-benches --bench side_by_side --";
const HARNESS: &str = "cargo bench -p admission-benches --bench scarce_and_wakes --";
const MEMORY: &str = "cargo bench -p admission-benches --bench waiter_memory";
/// The part the `waiter_memory` bench writes (`side-by-side/waiter_memory.json`, heap counted by
/// `dhat`'s allocator).
const MEMORY_PART: &str = "waiter_memory";
/// The part `side_by_side` writes beside its criterion groups: the contended semaphore, ours and
/// tokio's runs interleaved, each with its wall time, CPU time and context switches.
const CONTENDED_PART: &str = "semaphore_contended";

fn rows() -> Vec<Row> {
    use Src::{Criterion as C, Harness as H};
    let row = |item, what, unit, ours, peer, goal, command| Row {
        item,
        what,
        unit,
        ours,
        peer,
        goal,
        command,
    };
    vec![
        row(
            "1",
            "token bucket take, 1 token + 1 request: `TokenBucket::ask` (taking, as the head) vs governor `check`",
            Unit::Time,
            C("single_limit", "ours_token_bucket_take_1"),
            C("single_limit", "governor_check"),
            Goal::None,
            "single_limit",
        ),
        row(
            "1",
            "the same vs leaky-bucket `try_acquire(1)`",
            Unit::Time,
            C("single_limit", "ours_token_bucket_take_1"),
            C("single_limit", "leaky_bucket_try_acquire_1"),
            Goal::None,
            "single_limit",
        ),
        row(
            "1",
            "token bucket take, 100 tokens + 1 request vs governor `check_n(100)`",
            Unit::Time,
            C("single_limit", "ours_token_bucket_take_100"),
            C("single_limit", "governor_check_n_100"),
            Goal::RatioAtMost(1.5),
            "single_limit",
        ),
        row(
            "1",
            "the same vs leaky-bucket `try_acquire(100)`",
            Unit::Time,
            C("single_limit", "ours_token_bucket_take_100"),
            C("single_limit", "leaky_bucket_try_acquire_100"),
            Goal::None,
            "single_limit",
        ),
        row(
            "1",
            "elastic window take, 1 request: `ElasticWindow::ask` (taking, as the head; a 1 ms window) vs governor `check`",
            Unit::Time,
            C("single_limit", "ours_elastic_window_take_1"),
            C("single_limit", "governor_check"),
            Goal::RatioAtMost(3.0),
            "single_limit",
        ),
        row(
            "2",
            "semaphore, uncontended: `admit_blocking` + release on a `CountingGate` vs tokio `try_acquire_many(1)` + drop",
            Unit::Time,
            C("semaphore", "ours_admit_blocking_release"),
            C("semaphore", "tokio_try_acquire_many_release"),
            Goal::RatioAtMost(1.5),
            "'^semaphore/'",
        ),
        row(
            "2",
            "one gate, borrowed against borrowed: `try_admit` + release (a `BorrowedGrant` of a prebuilt demand) vs tokio `try_acquire_many(1)` + drop (a permit that borrows its semaphore)",
            Unit::Time,
            C("semaphore", "ours_try_admit_release"),
            C("semaphore", "tokio_try_acquire_many_release"),
            Goal::RatioAtMost(1.5),
            "'^semaphore/'",
        ),
        row(
            "2",
            "one gate, owned against owned: `admit_blocking` + release vs tokio `try_acquire_many_owned(1)` + drop (the owned permit takes and drops a clone of an `Arc<Semaphore>`, as our owned `Grant` does its monitor's handle)",
            Unit::Time,
            C("semaphore", "ours_admit_blocking_release"),
            C("semaphore", "tokio_try_acquire_many_owned_release"),
            Goal::RatioAtMost(1.5),
            "'^semaphore/'",
        ),
        row(
            "2",
            "the `admit` future polled once + release vs tokio `try_acquire_many(1)` + drop",
            Unit::Time,
            C("semaphore", "ours_admit_future_polled_once_release"),
            C("semaphore", "tokio_try_acquire_many_release"),
            Goal::None,
            "'^semaphore/'",
        ),
        row(
            "2",
            "floor: the `CountingGate`'s own take + give, no monitor (its last-activity stamp reads the system clock at both: an exact reading, the library keeps no clock thread)",
            Unit::Time,
            C("semaphore", "floor_gate_take_give"),
            C("semaphore", "tokio_try_acquire_many_release"),
            Goal::None,
            "'^semaphore/'",
        ),
        row(
            "2",
            "floor: the same on a fake clock that stands still",
            Unit::Time,
            C("semaphore", "floor_gate_take_give_frozen_clock"),
            C("semaphore", "tokio_try_acquire_many_release"),
            Goal::None,
            "'^semaphore/'",
        ),
        row(
            "2",
            "floor: the gate's take + give with the monitor's check for a parker after each (a fence and a load): what a `try_admit` + release cannot go below",
            Unit::Time,
            C("semaphore", "floor_gate_take_give_fenced"),
            C("semaphore", "tokio_try_acquire_many_release"),
            Goal::None,
            "'^semaphore/'",
        ),
        row(
            "2",
            "floor: the same with the reference counts an owned `Grant` takes and drops (the cloned demand, the job, the monitor): what an `admit_blocking` + release cannot go below",
            Unit::Time,
            C("semaphore", "floor_owned_grant_take_give_fenced"),
            C("semaphore", "tokio_try_acquire_many_release"),
            Goal::None,
            "'^semaphore/'",
        ),
        row(
            "2",
            "semaphore, contended 64 tasks x 10,000 on 8 permits held across a yield (`yield_now`), 2 workers, wall time of one run, median of the runs, ours and tokio's alternating: `admit().await` vs tokio `acquire().await`",
            Unit::Time,
            H(CONTENDED_PART, "ours_held_wall_ns_median", 1.0),
            H(CONTENDED_PART, "tokio_held_wall_ns_median", 1.0),
            Goal::RatioAtMost(1.2),
            "semaphore_contended",
        ),
        row(
            "2",
            "the same runs' CPU time: user + system of every thread of the process (the two workers, our evaluator), median",
            Unit::Time,
            H(CONTENDED_PART, "ours_held_cpu_ns_median", 1.0),
            H(CONTENDED_PART, "tokio_held_cpu_ns_median", 1.0),
            Goal::RatioAtMost(1.2),
            "semaphore_contended",
        ),
        row(
            "2",
            "the same runs' context switches, voluntary and not, median",
            Unit::Count,
            H(CONTENDED_PART, "ours_held_switches_median", 1.0),
            H(CONTENDED_PART, "tokio_held_switches_median", 1.0),
            Goal::None,
            "semaphore_contended",
        ),
        row(
            "2",
            "the same without an await while holding (at most 2 of the 8 permits ever out: the two acquire paths fought over by two threads, nobody waits), wall time",
            Unit::Time,
            H(CONTENDED_PART, "ours_no_await_wall_ns_median", 1.0),
            H(CONTENDED_PART, "tokio_no_await_wall_ns_median", 1.0),
            Goal::RatioAtMost(1.2),
            "semaphore_contended",
        ),
        row(
            "2",
            "the same, CPU time",
            Unit::Time,
            H(CONTENDED_PART, "ours_no_await_cpu_ns_median", 1.0),
            H(CONTENDED_PART, "tokio_no_await_cpu_ns_median", 1.0),
            Goal::None,
            "semaphore_contended",
        ),
        row(
            "3",
            "three limits, uncontended (HTTP gate, token bucket, DB gate), demand cloned per call, vs tokio `try_acquire` + governor `check_n(100)` + tokio `try_acquire`",
            Unit::Time,
            C("three_limits", "ours_cloned_demand"),
            C("three_limits", "chain_tokio_governor_tokio"),
            Goal::RatioAtMost(1.0),
            "three_limits",
        ),
        row(
            "3",
            "the same, demand built per call",
            Unit::Time,
            C("three_limits", "ours_fresh_demand"),
            C("three_limits", "chain_tokio_governor_tokio"),
            Goal::RatioAtMost(1.0),
            "three_limits",
        ),
        row(
            "3",
            "the same with `try_admit` of the prebuilt demand (borrowed, as the chain's permits borrow their semaphores)",
            Unit::Time,
            C("three_limits", "ours_try_admit"),
            C("three_limits", "chain_tokio_governor_tokio"),
            Goal::RatioAtMost(1.0),
            "three_limits",
        ),
        row(
            "3",
            "floor: the three accounts' own takes and the two gates' gives, no monitor",
            Unit::Time,
            C("three_limits", "floor_accounts_take_give"),
            C("three_limits", "chain_tokio_governor_tokio"),
            Goal::None,
            "three_limits",
        ),
        row(
            "3",
            "tokens spent by 1,000 attempts of 100 tokens refused by the DB limit (frozen clocks)",
            Unit::Tokens,
            H("leak", "ours_tokens_leaked", 1.0),
            H("leak", "chain_tokens_leaked", 1.0),
            Goal::OursZero,
            "leak",
        ),
        row(
            "4",
            "model B's completed calls/s, HTTP pool 16, model A short of tokens: monitor vs hold-and-wait chain",
            Unit::PerSecond,
            H("goodput", "ours_b_calls_per_s", 1.0),
            H("goodput", "chain_b_calls_per_s", 1.0),
            Goal::RatioAtLeast(5.0),
            "goodput",
        ),
        row(
            "4",
            "model A's completed calls/s (its budget: 5/s)",
            Unit::PerSecond,
            H("goodput", "ours_a_calls_per_s", 1.0),
            H("goodput", "chain_a_calls_per_s", 1.0),
            Goal::None,
            "goodput",
        ),
        row(
            "4",
            "HTTP permits held by jobs waiting for tokens (mean)",
            Unit::Permits,
            H("goodput", "ours_permits_held_waiting", 1.0),
            H("goodput", "chain_permits_held_waiting", 1.0),
            Goal::None,
            "goodput",
        ),
        row(
            "5",
            "wake, give to running, p50, waiter settled 50 us: async `admit` vs tokio `Semaphore::acquire`",
            Unit::Time,
            H("wake", "ours_settled_p50_us", 1e3),
            H("wake", "tokio_settled_p50_us", 1e3),
            Goal::RatioAtMost(1.2),
            "wake",
        ),
        row(
            "5",
            "the same, p99",
            Unit::Time,
            H("wake", "ours_settled_p99_us", 1e3),
            H("wake", "tokio_settled_p99_us", 1e3),
            Goal::None,
            "wake",
        ),
        row(
            "5",
            "wake, give to running, p50, released as soon as the waiter is parked",
            Unit::Time,
            H("wake", "ours_hot_p50_us", 1e3),
            H("wake", "tokio_hot_p50_us", 1e3),
            Goal::RatioAtMost(1.2),
            "wake",
        ),
        row(
            "5",
            "the same, p99",
            Unit::Time,
            H("wake", "ours_hot_p99_us", 1e3),
            H("wake", "tokio_hot_p99_us", 1e3),
            Goal::None,
            "wake",
        ),
        row(
            "5",
            "token deadline overshoot p50: `admit` on an empty `TokenBucket` vs governor `until_ready`",
            Unit::Time,
            H("deadline", "ours_p50_us", 1e3),
            H("deadline", "governor_p50_us", 1e3),
            Goal::None,
            "deadline",
        ),
        row(
            "5",
            "token deadline overshoot p99",
            Unit::Time,
            H("deadline", "ours_p99_us", 1e3),
            H("deadline", "governor_p99_us", 1e3),
            Goal::RatioAtMost(1.0),
            "deadline",
        ),
        row(
            "6",
            "one evaluator pass over 10,000 parked waiters, one `CountingGate` each; peer: the same questions to the accounts alone",
            Unit::Time,
            C("pass_over_10k_parked", "ours_one_gate"),
            C("pass_over_10k_parked", "floor_one_gate"),
            Goal::RatioAtMost(2.0),
            "pass_over_10k_parked",
        ),
        row(
            "6",
            "the same, three accounts each (HTTP gate, token bucket, scarce gate)",
            Unit::Time,
            C("pass_over_10k_parked", "ours_gate_bucket_gate"),
            C("pass_over_10k_parked", "floor_gate_bucket_gate"),
            Goal::RatioAtMost(2.0),
            "pass_over_10k_parked",
        ),
        row(
            "6",
            "the one-gate pass against the specification's bound for 10,000 waiters",
            Unit::Time,
            C("pass_over_10k_parked", "ours_one_gate"),
            Src::Nothing,
            Goal::OursBelow(5e6),
            "pass_over_10k_parked",
        ),
        row(
            "7",
            "heap the monitor holds per parked waiter, one entry (its slot in the line's slab, which keeps the waiter's record and then its decision), counted by `dhat`",
            Unit::Bytes,
            H(MEMORY_PART, "heap_bytes_per_waiter_1_entries", 1.0),
            Src::Nothing,
            Goal::BytesAtMost(64.0),
            "",
        ),
        row(
            "7",
            "the same, three entries",
            Unit::Bytes,
            H(MEMORY_PART, "heap_bytes_per_waiter_3_entries", 1.0),
            Src::Nothing,
            Goal::None,
            "",
        ),
        row(
            "7",
            "everything a parked waiter costs, one entry: the monitor's heap above plus the `Admit` future the caller holds",
            Unit::Bytes,
            H(MEMORY_PART, "total_bytes_per_waiter_1_entries", 1.0),
            Src::Nothing,
            Goal::None,
            "",
        ),
    ]
}

/// A figure in its unit, with a dagger when it is left over from an earlier run.
fn show(figure: Option<&Figure>, unit: Unit) -> String {
    let Some(figure) = figure else {
        return "not measured".to_owned();
    };
    let v = figure.value;
    let mut text = match unit {
        Unit::Time if v < 1e3 => format!("{v:.1} ns"),
        Unit::Time if v < 1e6 => format!("{:.1} us", v / 1e3),
        Unit::Time if v < 1e9 => format!("{:.1} ms", v / 1e6),
        Unit::Time => format!("{:.2} s", v / 1e9),
        Unit::PerSecond => format!("{v:.1}/s"),
        Unit::Tokens => format!("{v:.0}"),
        Unit::Permits => format!("{v:.1}"),
        Unit::Bytes => format!("{v:.1} B"),
        Unit::Count => format!("{v:.0}"),
    };
    if figure.stale {
        text.push_str(" †");
    }
    text
}

fn goal_text(goal: Goal) -> String {
    match goal {
        Goal::None => "-".to_owned(),
        Goal::RatioAtMost(r) => format!("≤ {r:.1}"),
        Goal::RatioAtLeast(r) => format!("≥ {r:.0}"),
        Goal::OursZero => "ours = 0".to_owned(),
        Goal::OursBelow(ns) => format!("ours < {:.0} ms", ns / 1e6),
        Goal::BytesAtMost(bytes) => format!("ours ≤ {bytes:.0} B"),
    }
}

fn verdict(goal: Goal, ours: Option<&Figure>, ratio: Option<f64>) -> &'static str {
    let met = match (goal, ours, ratio) {
        (Goal::None, _, _) => return "-",
        (Goal::RatioAtMost(r), _, Some(ratio)) => ratio <= r,
        (Goal::RatioAtLeast(r), _, Some(ratio)) => ratio >= r,
        (Goal::OursZero, Some(ours), _) => ours.value == 0.0,
        (Goal::OursBelow(limit), Some(ours), _) => ours.value < limit,
        (Goal::BytesAtMost(limit), Some(ours), _) => ours.value <= limit,
        _ => return "not measured",
    };
    if met { "met" } else { "**missed**" }
}

/// The peer figure that names the machine's mode: tokio's `try_acquire_many(1)` + drop, a few
/// atomic operations on one word, which nothing of ours can slow down.
const MODE_FIGURE: Src = Src::Criterion("semaphore", "tokio_try_acquire_many_release");

/// Above this median of [`MODE_FIGURE`] the VM is in its slow mode. This VM has two speeds, each
/// lasting minutes; in the slow one the peers run one and a half to three times slower and ours
/// less so, which moves every ratio. The figure in the recorded runs (docs/benchmarks/): 10.5,
/// 19.6, 20.0, 22.1-23.5 ns in the fast mode; 30.8, 33.5, 34.6, 34.7 ns in the slow one. The
/// threshold sits in the gap between the two.
const SLOW_ABOVE_NS: f64 = 27.0;

/// The header's sentence on the machine's mode, from [`MODE_FIGURE`] as this run left it.
fn mode(figure: Option<&Figure>) -> String {
    const WHAT: &str = "tokio's `try_acquire_many(1)` + drop";
    match figure {
        Some(figure) if !figure.stale => {
            let mode = if figure.value > SLOW_ABOVE_NS {
                "slow"
            } else {
                "fast"
            };
            format!(
                "The VM was in its **{mode} mode** by the peers' own figures: {WHAT} took {:.1} ns \
                 in this run (slow mode above {SLOW_ABOVE_NS:.0} ns, fast mode at or below).",
                figure.value
            )
        }
        Some(_) => {
            format!("The VM's mode is not known: this run did not measure {WHAT}, which tells it.")
        }
        None => format!("The VM's mode is not known: there is no figure for {WHAT}."),
    }
}

fn render(sources: &Sources, run: Option<&RunInfo>) -> String {
    let mut out = String::new();
    let header = match run {
        Some(run) => format!(
            "Recorded by `cargo xtask bench` (`{}`) starting {}, {} min {} s; commit `{}`; \
             1-minute load average before the run {}; {} CPUs; {}.",
            run.command,
            utc(run.started_unix),
            run.seconds / 60,
            run.seconds % 60,
            run.commit,
            run.load,
            run.cpus,
            run.rustc,
        ),
        None => "No recorded run: the figures are whatever is on disk.".to_owned(),
    };
    let header = format!("{header} {}", mode(sources.read(MODE_FIGURE).as_ref()));
    out.push_str(&wrap(&header));
    out.push('\n');
    out.push_str(&wrap(
        "Ratio is ours ÷ peer on every row: for times and counts lower is better, for calls per \
         second higher is better. Times are criterion medians, or the harness's medians and percentiles.",
    ));
    out.push('\n');
    out.push_str("| # | what | ours | peer | ratio | goal | verdict | command |\n");
    out.push_str("| --- | --- | ---: | ---: | ---: | --- | --- | --- |\n");
    let mut stale = false;
    for row in rows() {
        let ours = sources.read(row.ours);
        let peer = sources.read(row.peer);
        stale |= ours.as_ref().is_some_and(|f| f.stale) || peer.as_ref().is_some_and(|f| f.stale);
        let ratio = match (row.unit, &ours, &peer) {
            (Unit::Time | Unit::PerSecond | Unit::Count, Some(o), Some(p)) if p.value > 0.0 => {
                Some(o.value / p.value)
            }
            _ => None,
        };
        let ratio_text = ratio.map_or_else(
            || "-".to_owned(),
            |r| {
                if r >= 10.0 {
                    format!("{r:.0}")
                } else {
                    format!("{r:.2}")
                }
            },
        );
        let command = match row.ours {
            // The `waiter_memory` bench writes its part as the harness does, but runs alone.
            Src::Harness(MEMORY_PART, ..) => MEMORY.to_owned(),
            Src::Harness(CONTENDED_PART, ..) => format!("{SIDE} {}", row.command),
            Src::Harness(..) => format!("{HARNESS} {}", row.command),
            Src::Criterion(..) | Src::Nothing => format!("{SIDE} {}", row.command),
        };
        let peer_text = match row.peer {
            Src::Nothing => "-".to_owned(),
            _ => show(peer.as_ref(), row.unit),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | `{command}` |",
            row.item,
            row.what,
            show(ours.as_ref(), row.unit),
            peer_text,
            ratio_text,
            goal_text(row.goal),
            verdict(row.goal, ours.as_ref(), ratio),
        );
    }
    if stale {
        out.push_str("\n† left over from an earlier run: this run did not measure it.\n");
    }
    out
}

/// `text` as lines of at most 100 characters (longer words stay whole), each ending in `\n`.
fn wrap(text: &str) -> String {
    const WIDTH: usize = 100;
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > WIDTH {
            out.push_str(&line);
            out.push('\n');
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        out.push_str(&line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00 UTC");
        assert_eq!(utc(951_827_696), "2000-02-29 12:34 UTC");
        assert_eq!(utc(1_798_675_200), "2026-12-31 00:00 UTC");
    }

    #[test]
    fn splice_replaces_between_markers_or_adds_a_section() {
        let doc = format!("# T\n\nintro\n\n{BEGIN}\nold\n{END}\n\nrest\n");
        assert_eq!(
            splice(&doc, "new\n").expect("markers"),
            format!("# T\n\nintro\n\n{BEGIN}\nnew\n{END}\n\nrest\n")
        );
        let added = splice("# T\n\nintro\n", "new\n").expect("no markers");
        assert!(added.starts_with(&format!(
            "# T\n\n## Side by side (`cargo xtask bench`)\n\n{BEGIN}\nnew\n{END}\n\nintro"
        )));
        assert!(splice(&format!("{END}\n{BEGIN}\n"), "x").is_err());
    }

    #[test]
    fn wrap_breaks_at_spaces_within_the_width() {
        let text = "word ".repeat(30);
        let wrapped = wrap(&text);
        assert!(wrapped.lines().all(|l| l.len() <= 100));
        assert_eq!(wrapped.split_whitespace().count(), 30);
        assert_eq!(wrap(""), "");
    }

    #[test]
    fn the_mode_is_named_by_this_runs_tokio_figure() {
        let figure = |value, stale| Figure { value, stale };
        assert!(mode(Some(&figure(23.4, false))).contains("**fast mode**"));
        assert!(mode(Some(&figure(23.4, false))).contains("took 23.4 ns"));
        assert!(mode(Some(&figure(23.4, false))).contains("slow mode above 27 ns"));
        assert!(mode(Some(&figure(SLOW_ABOVE_NS, false))).contains("**fast mode**"));
        assert!(mode(Some(&figure(30.8, false))).contains("**slow mode**"));
        assert!(mode(Some(&figure(36.0, true))).contains("not known: this run did not measure"));
        assert!(mode(None).contains("not known"));
    }

    #[test]
    fn the_gate_and_contended_rows_are_read_from_one_runs_files() {
        let target = std::env::temp_dir().join(format!("xtask-bench-rows-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&target);
        let estimate = |bench: &str, ns: f64| {
            let dir = target.join("criterion/semaphore").join(bench).join("new");
            std::fs::create_dir_all(&dir).unwrap();
            let json = format!(r#"{{"median": {{"point_estimate": {ns}}}}}"#);
            std::fs::write(dir.join("estimates.json"), json).unwrap();
        };
        estimate("ours_admit_blocking_release", 60.0);
        estimate("ours_try_admit_release", 30.0);
        estimate("tokio_try_acquire_many_release", 22.0);
        estimate("tokio_try_acquire_many_owned_release", 30.0);
        std::fs::create_dir_all(target.join("side-by-side")).unwrap();
        let contended = r#"{"ours_held_wall_ns_median": 6e8, "tokio_held_wall_ns_median": 5e8,
            "ours_held_cpu_ns_median": 1.3e9, "tokio_held_cpu_ns_median": 1e9,
            "ours_held_switches_median": 300, "tokio_held_switches_median": 200}"#;
        std::fs::write(
            target.join("side-by-side/semaphore_contended.json"),
            contended,
        )
        .unwrap();
        let sources = Sources {
            target: target.clone(),
            since: None,
        };
        let table = render(&sources, None);
        std::fs::remove_dir_all(&target).unwrap();
        let row = |start: &str| {
            table
                .lines()
                .find(|l| l.starts_with(&format!("| 2 | {start}")))
                .unwrap_or_else(|| panic!("no row {start:?} in\n{table}"))
                .to_owned()
        };
        assert!(table.contains("**fast mode**"), "{table}");
        assert!(table.contains("took 22.0 ns"), "{table}");
        let owned = row("one gate, owned against owned");
        assert!(
            owned.contains("| 60.0 ns | 30.0 ns | 2.00 | ≤ 1.5 | **missed** |"),
            "{owned}"
        );
        let borrowed = row("one gate, borrowed against borrowed");
        assert!(
            borrowed.contains("| 30.0 ns | 22.0 ns | 1.36 | ≤ 1.5 | met |"),
            "{borrowed}"
        );
        let wall = row("semaphore, contended 64 tasks x 10,000");
        assert!(
            wall.contains("| 600.0 ms | 500.0 ms | 1.20 | ≤ 1.2 | met |"),
            "{wall}"
        );
        let cpu = row("the same runs' CPU time");
        assert!(
            cpu.contains("| 1.30 s | 1.00 s | 1.30 | ≤ 1.2 | **missed** |"),
            "{cpu}"
        );
        assert!(
            cpu.contains("--bench side_by_side -- semaphore_contended`"),
            "{cpu}"
        );
        let switches = row("the same runs' context switches");
        assert!(
            switches.contains("| 300 | 200 | 1.50 | - | - |"),
            "{switches}"
        );
        let no_await = row("the same without an await while holding");
        assert!(
            no_await.contains("| not measured | not measured | - |"),
            "{no_await}"
        );
    }

    #[test]
    fn options_before_the_cargo_args_are_ours() {
        let args: Vec<String> = ["--all", "--", "--report-only"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let options = parse(&args);
        assert!(options.all && !options.report_only);
        assert_eq!(options.rest, ["--", "--report-only"]);
    }
}
