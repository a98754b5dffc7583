//! `cargo xtask lock-bench [--runs N] [--rounds R]`: the monitor's lock, parking_lot's mutex (the
//! default) against std's, the two builds run alternately.
//!
//! `admission-core` takes its lock from the compiler's cfg, so each lock is a build of its own:
//! the `monitor_lock` bench of `admission-benches` is built once as it is and once with
//! RUSTFLAGS adding `--cfg admission_monitor_lock="std"`, each into `<target>/lock-bench/<lock>`
//! so that both executables stay. Then they run in turn, parking_lot, std, parking_lot, std, ...,
//! N times each; each run is one process that prints one JSON line per row (see the bench's
//! docs). Alternating spreads the machine's slow and fast spells over both locks. The table
//! gives, per row, each lock's median over its runs of the wall time, the process's CPU time
//! (user + system of every thread, `getrusage(RUSAGE_SELF)`) and its voluntary and involuntary
//! context switches, and std's over parking_lot's.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::step::Workspace;

/// The two builds in the order their runs alternate, and the cfg each adds (none: the default).
const LOCKS: [(&str, Option<&str>); 2] = [
    ("parking_lot", None),
    ("std", Some("--cfg admission_monitor_lock=\"std\"")),
];
/// The bench target of `admission-benches` that measures one lock.
const TARGET: &str = "monitor_lock";
/// Measured workloads of each row per run, after one warm-up.
const WORKLOADS: usize = 2;
/// Runs of each lock when `--runs` is not given.
const DEFAULT_RUNS: usize = 5;
/// What each row of the bench is, for the table (`{R}`: the admits per task).
const ROWS: [(&str, &str); 3] = [
    (
        "contended_held",
        "contended: 64 tasks x {R} on 8 permits held across a yield, 2 workers; per workload",
    ),
    (
        "contended_no_await",
        "the same without an await while holding (nobody parks); per workload",
    ),
    (
        "gate_try_admit",
        "uncontended: one gate's `try_admit` + release, one thread (no monitor lock taken); \
         times per admit, switches per 1,000,000 admits",
    ),
];

/// The command line: runs of each lock, and the contended rows' admits per task if not 10,000.
#[derive(Debug, PartialEq)]
struct Options {
    runs: usize,
    rounds: Option<usize>,
}

fn parse(args: &[String]) -> Result<Options> {
    let mut options = Options {
        runs: DEFAULT_RUNS,
        rounds: None,
    };
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let value = args.next().map(|n| n.parse::<usize>());
        let n = match (flag.as_str(), value) {
            ("--runs" | "--rounds", Some(Ok(n))) if n > 0 => n,
            ("--runs" | "--rounds", _) => bail!("{flag} takes a positive number"),
            _ => bail!("usage: cargo xtask lock-bench [--runs N] [--rounds R]"),
        };
        if flag == "--runs" {
            options.runs = n;
        } else {
            options.rounds = Some(n);
        }
    }
    Ok(options)
}

/// `cargo xtask lock-bench [--runs N] [--rounds R]`.
pub(crate) fn run(ws: &Workspace, args: &[String]) -> Result<ExitCode> {
    let options = parse(args)?;
    let root = crate::bench::target_dir(ws)?.join("lock-bench");
    let mut exes = Vec::new();
    for (lock, cfg) in LOCKS {
        exes.push(build(ws, lock, cfg, &root.join(lock))?);
    }
    let mut samples: Vec<Sample> = Vec::new();
    for run in 1..=options.runs {
        for ((lock, _), exe) in LOCKS.iter().zip(&exes) {
            let got = run_once(ws, exe, &options)?;
            if let Some(wrong) = got.iter().find(|s| s.lock != *lock) {
                bail!(
                    "{} was built for the {lock} lock but says `{}`: the cfg did not reach it",
                    exe.display(),
                    wrong.lock
                );
            }
            let line: Vec<String> = got
                .iter()
                .map(|s| format!("{} {} wall {} CPU", s.row, time(s.wall_ns), time(s.cpu_ns)))
                .collect();
            println!(
                "==> lock-bench: run {run}/{} {lock}: {}",
                options.runs,
                line.join("; ")
            );
            samples.extend(got);
        }
    }
    println!();
    print!("{}", table(&options, &samples));
    Ok(ExitCode::SUCCESS)
}

/// Builds the bench target into `target`, adding `cfg` to RUSTFLAGS, and answers its executable.
fn build(ws: &Workspace, lock: &str, cfg: Option<&str>, target: &Path) -> Result<PathBuf> {
    let args = [
        "bench",
        "-p",
        "admission-benches",
        "--bench",
        TARGET,
        "--no-run",
        "--message-format=json-render-diagnostics",
    ];
    let rustflags = rustflags(std::env::var_os("RUSTFLAGS"), cfg);
    println!(
        "==> lock-bench: RUSTFLAGS={rustflags:?} CARGO_TARGET_DIR={} cargo {}",
        target.display(),
        args.join(" ")
    );
    // RUSTFLAGS is ignored when CARGO_ENCODED_RUSTFLAGS is set: it goes (the lock check after
    // each run fails if anything else drops the cfg).
    let output = Command::new(&ws.cargo)
        .args(args)
        .current_dir(&ws.root)
        .env("RUSTFLAGS", &rustflags)
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env("CARGO_TARGET_DIR", target)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .context("could not run cargo bench --no-run")?;
    if !output.status.success() {
        bail!(
            "building {TARGET} for the {lock} lock failed ({})",
            output.status
        );
    }
    executable(&String::from_utf8_lossy(&output.stdout), TARGET)
        .with_context(|| format!("cargo named no executable for the bench `{TARGET}`"))
}

/// The caller's RUSTFLAGS with `cfg` added.
fn rustflags(existing: Option<OsString>, cfg: Option<&str>) -> String {
    let existing = existing.map(|f| f.to_string_lossy().trim().to_owned());
    let words: Vec<&str> = existing
        .as_deref()
        .into_iter()
        .chain(cfg)
        .filter(|w| !w.is_empty())
        .collect();
    words.join(" ")
}

/// The executable of the bench target `name`, from cargo's JSON messages.
fn executable(messages: &str, name: &str) -> Option<PathBuf> {
    messages
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|m| {
            m["reason"] == "compiler-artifact"
                && m["target"]["name"] == name
                && m["target"]["kind"]
                    .as_array()
                    .is_some_and(|kinds| kinds.iter().any(|k| k == "bench"))
        })
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
}

/// One row of one run, per workload.
#[derive(Debug, PartialEq)]
struct Sample {
    lock: String,
    row: String,
    admits: f64,
    wall_ns: f64,
    cpu_ns: f64,
    voluntary: f64,
    involuntary: f64,
}

impl Sample {
    fn from_line(line: &str) -> Result<Sample> {
        let value: Value = serde_json::from_str(line).context("the bench's line is not JSON")?;
        let number = |key: &str| {
            value[key]
                .as_f64()
                .with_context(|| format!("the bench's line has no number `{key}`: {line}"))
        };
        let text = |key: &str| {
            value[key]
                .as_str()
                .map(str::to_owned)
                .with_context(|| format!("the bench's line has no text `{key}`: {line}"))
        };
        Ok(Sample {
            lock: text("lock")?,
            row: text("row")?,
            admits: number("admits")?,
            wall_ns: number("wall_ns")?,
            cpu_ns: number("cpu_ns")?,
            voluntary: number("voluntary")?,
            involuntary: number("involuntary")?,
        })
    }
}

/// Runs `exe` once and reads its JSON lines.
fn run_once(ws: &Workspace, exe: &Path, options: &Options) -> Result<Vec<Sample>> {
    let mut command = Command::new(exe);
    command.args(["--workloads", &WORKLOADS.to_string()]);
    if let Some(rounds) = options.rounds {
        command.args(["--rounds", &rounds.to_string()]);
    }
    let output = command
        .current_dir(&ws.root)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("could not run {}", exe.display()))?;
    if !output.status.success() {
        bail!("{} failed ({})", exe.display(), output.status);
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let samples = stdout
        .lines()
        .filter(|l| l.trim_start().starts_with('{'))
        .map(Sample::from_line)
        .collect::<Result<Vec<_>>>()?;
    if samples.is_empty() {
        bail!("{} printed no JSON line: {stdout}", exe.display());
    }
    Ok(samples)
}

/// The middle value, or the mean of the two middle ones for an even count.
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => values[n / 2],
        _ => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// A time in nanoseconds, in the unit that suits it.
fn time(ns: f64) -> String {
    match ns {
        _ if ns >= 1e9 => format!("{:.2} s", ns / 1e9),
        _ if ns >= 1e6 => format!("{:.1} ms", ns / 1e6),
        _ if ns >= 1e3 => format!("{:.1} us", ns / 1e3),
        _ => format!("{ns:.1} ns"),
    }
}

fn count(n: f64) -> String {
    format!("{n:.0}")
}

/// The comparison: per row, per figure, each lock's median and std ÷ parking_lot.
fn table(options: &Options, samples: &[Sample]) -> String {
    let mut out = String::new();
    let rounds = options
        .rounds
        .map_or_else(|| "10,000".to_owned(), |r| r.to_string());
    let _ = writeln!(
        out,
        "lock-bench: {} runs of each build, alternated (parking_lot, std, ...); each run {WORKLOADS} \
         workloads of each row after a warm-up; medians over the runs\n",
        options.runs
    );
    out.push_str("| row | figure | parking_lot | std | std ÷ parking_lot |\n");
    out.push_str("| --- | --- | ---: | ---: | ---: |\n");
    for (row, what) in ROWS {
        // Times per admit on the uncontended row, per workload on the others; switches per
        // workload (a million admits on the uncontended row).
        let per_admit = row == "gate_try_admit";
        let figures = [
            "wall time",
            "CPU time (user + system, all threads)",
            "voluntary switches",
            "involuntary switches",
        ];
        for (i, figure) in figures.into_iter().enumerate() {
            let read = |s: &Sample| {
                let per = if per_admit { s.admits } else { 1.0 };
                [s.wall_ns / per, s.cpu_ns / per, s.voluntary, s.involuntary][i]
            };
            let [pl, std] = [LOCKS[0].0, LOCKS[1].0].map(|lock| {
                let of_lock = samples.iter().filter(|s| s.lock == lock && s.row == row);
                median(of_lock.map(read).collect())
            });
            let show = if i < 2 { time } else { count };
            let ratio = if pl > 0.0 && std.is_finite() {
                format!("{:.2}", std / pl)
            } else {
                "-".to_owned()
            };
            let name = if i == 0 {
                what.replace("{R}", &rounds)
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "| {name} | {figure} | {} | {} | {ratio} |",
                show(pl),
                show(std)
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn options() {
        let runs = |runs, rounds| Options { runs, rounds };
        assert_eq!(parse(&[]).unwrap(), runs(5, None));
        assert_eq!(parse(&args(&["--runs", "3"])).unwrap(), runs(3, None));
        assert_eq!(
            parse(&args(&["--rounds", "500", "--runs", "2"])).unwrap(),
            runs(2, Some(500))
        );
        for bad in [
            &["--runs", "0"][..],
            &["--runs"],
            &["3"],
            &["--rounds", "x"],
        ] {
            assert!(parse(&args(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_cfg_is_added_to_the_callers_rustflags() {
        let std = Some("--cfg admission_monitor_lock=\"std\"");
        assert_eq!(rustflags(None, std), "--cfg admission_monitor_lock=\"std\"");
        assert_eq!(rustflags(None, None), "");
        assert_eq!(
            rustflags(Some("-C target-cpu=native ".into()), std),
            "-C target-cpu=native --cfg admission_monitor_lock=\"std\""
        );
        assert_eq!(rustflags(Some(" ".into()), None), "");
    }

    #[test]
    fn the_bench_executable_is_read_from_cargos_messages() {
        let message = |name: &str, kind: &str, exe: Option<&str>| {
            serde_json::json!({
                "reason": "compiler-artifact",
                "target": { "kind": [kind], "name": name },
                "executable": exe,
            })
            .to_string()
        };
        let messages = [
            message("admission_benches", "lib", None),
            message("side_by_side", "bench", Some("/t/side_by_side-1")),
            "not json".to_owned(),
            message("monitor_lock", "bench", Some("/t/monitor_lock-2")),
            r#"{"reason":"build-finished","success":true}"#.to_owned(),
        ]
        .join("\n");
        assert_eq!(
            executable(&messages, "monitor_lock"),
            Some(PathBuf::from("/t/monitor_lock-2"))
        );
        assert_eq!(executable(&messages, "switches"), None);
    }

    #[test]
    fn a_line_is_read() {
        let line = r#"{"lock": "std", "row": "contended_held", "admits": 640000, "workloads": 2, "wall_ns": 5e8, "cpu_ns": 1e9, "voluntary": 10, "involuntary": 4}"#;
        let sample = Sample::from_line(line).unwrap();
        assert_eq!(
            (sample.lock.as_str(), sample.row.as_str()),
            ("std", "contended_held")
        );
        assert_eq!(
            (sample.wall_ns, sample.voluntary, sample.involuntary),
            (5e8, 10.0, 4.0)
        );
        assert!(Sample::from_line(r#"{"lock": "std", "row": "x"}"#).is_err());
        assert!(Sample::from_line("{").is_err());
    }

    #[test]
    fn medians_and_times() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(vec![]).is_nan());
        assert_eq!(time(61.25), "61.2 ns");
        assert_eq!(time(2.5e7), "25.0 ms");
        assert_eq!(time(1.5e9), "1.50 s");
    }

    #[test]
    fn the_table_gives_each_locks_median_and_the_ratio() {
        let sample = |lock: &str, row: &str, wall_ns: f64, admits: f64| Sample {
            lock: lock.to_owned(),
            row: row.to_owned(),
            admits,
            wall_ns,
            cpu_ns: 2.0 * wall_ns,
            voluntary: 100.0,
            involuntary: 5.0,
        };
        let samples = [
            sample("parking_lot", "contended_held", 4e8, 640_000.0),
            sample("std", "contended_held", 6e8, 640_000.0),
            sample("parking_lot", "contended_held", 6e8, 640_000.0),
            sample("std", "contended_held", 6e8, 640_000.0),
            sample("parking_lot", "gate_try_admit", 6e7, 1e6),
            sample("std", "gate_try_admit", 3e7, 1e6),
        ];
        let options = Options {
            runs: 2,
            rounds: None,
        };
        let table = table(&options, &samples);
        assert!(
            table.contains("| contended: 64 tasks x 10,000 on 8 permits"),
            "{table}"
        );
        let short = Options {
            runs: 1,
            rounds: Some(500),
        };
        assert!(super::table(&short, &samples).contains("64 tasks x 500 on 8 permits"));
        assert!(
            table.contains("| wall time | 500.0 ms | 600.0 ms | 1.20 |"),
            "{table}"
        );
        assert!(
            table.contains("| CPU time (user + system, all threads) | 1.00 s | 1.20 s | 1.20 |")
        );
        assert!(
            table.contains("| wall time | 60.0 ns | 30.0 ns | 0.50 |"),
            "{table}"
        );
        assert!(table.contains("| voluntary switches | 100 | 100 | 1.00 |"));
        // A row without samples shows no ratio.
        assert!(table.contains("| - |"));
    }
}
