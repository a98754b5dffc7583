//! `cargo xtask load [SECONDS] [--exe PATH]`: the axum example under `wrk`, with and without its
//! line bound, for BENCHMARKS.md.
//!
//! The example is built in release (`cargo build --release --example axum`; `--exe PATH` runs an
//! executable built earlier instead, to measure an older commit with the same harness), then for
//! 8, 64 and 256 connections it is started twice on a free loopback port, once with `--no-shed`
//! (every request waits up to the 5 s timeout) and once as it ships (`LineBound::ExpectedWait`
//! of 4.5 s, the timeout less half a second), and `wrk` sends `POST /summarize?tokens=800` over that many keep-alive
//! connections for SECONDS (default 20):
//! `wrk -t N -c N -d SECONDS --timeout 60s -s target/load/load.lua URL`. A fresh server each
//! time, so each run starts with the model's bucket full. The model admits a request of 1,000
//! tokens a second (60,000 a minute) after its first 60, so everything past that is refused: the
//! question is how soon.
//!
//! The script (`load.lua` beside this file, written to `target/load/`) gives each wrk thread one
//! connection and times every request on it, counting the answers by status and by the refusal's
//! reason (`503 shed`, `503 timed_out`, ...). Per run it prints the answers by kind, how many
//! requests were refused only after waiting the whole timeout (`503 timed_out`: the goal is 0
//! with the bound), the goodput (200s a second), and the p50 / p99 latency of refusals and of
//! successes; each run's line of figures is kept under `target/load/`. `wrk` must be on PATH
//! (`apt-get install wrk`); this step is not part of `cargo xtask ci`.

use std::io::{BufRead as _, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};

use anyhow::{Context, Result, bail};

use crate::step::Workspace;

/// Connections per run.
const CONNECTIONS: [u32; 3] = [8, 64, 256];

/// The wrk script: one connection per thread, answers counted by kind with their latencies.
const SCRIPT: &str = include_str!("load.lua");

/// The line the script's `done` prints its figures on.
const PREFIX: &str = "xtask-load ";

const USAGE: &str = "usage: cargo xtask load [SECONDS] [--exe PATH]";

/// One kind of answer (`200`, `503 shed`, `503 timed_out`, ...) in one run.
#[derive(Debug, PartialEq)]
struct Kind {
    name: String,
    count: u64,
    p50_ms: f64,
    p99_ms: f64,
}

impl Kind {
    /// The p50 and p99, when there was any answer of the kind.
    fn percentiles(&self) -> Option<(f64, f64)> {
        (self.count > 0).then_some((self.p50_ms, self.p99_ms))
    }

    /// `name`'s figures in the script's JSON `value`.
    fn read(name: &str, value: &serde_json::Value) -> Result<Kind> {
        let number = |key: &str| {
            value[key]
                .as_f64()
                .with_context(|| format!("no number `{key}` for `{name}`"))
        };
        Ok(Kind {
            name: name.to_owned(),
            count: value["count"]
                .as_u64()
                .with_context(|| format!("no count for `{name}`"))?,
            p50_ms: number("p50_ms")?,
            p99_ms: number("p99_ms")?,
        })
    }
}

/// One run's figures, from the script's line.
#[derive(Debug, PartialEq)]
struct Run {
    seconds: f64,
    /// Requests still unanswered when wrk stopped.
    cut: u64,
    socket_errors: u64,
    /// By count, most first.
    kinds: Vec<Kind>,
    /// Every refusal (any status but 2xx), and every success.
    refused: Kind,
    ok: Kind,
}

impl Run {
    fn count(&self, name: &str) -> u64 {
        self.kinds
            .iter()
            .filter(|k| k.name == name)
            .map(|k| k.count)
            .sum()
    }
}

pub(crate) fn run(ws: &Workspace, args: &[String]) -> Result<ExitCode> {
    let mut seconds = 20;
    let mut exe: Option<PathBuf> = None;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--exe" => exe = Some(args.next().context(USAGE)?.into()),
            n => {
                seconds = n.parse().ok().filter(|n| *n > 0).context(USAGE)?;
            }
        }
    }
    let wrk = Command::new("wrk").arg("--version").output();
    // wrk prints its version and usage and exits 1.
    if !wrk.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).starts_with("wrk ")) {
        bail!("load: `wrk` is not on PATH; install it with `apt-get install wrk`");
    }
    let exe = match exe {
        Some(exe) => exe,
        None => {
            println!("==> load: cargo build --release --example axum");
            crate::chaos::build_example(ws, "axum")?
        }
    };
    let out = ws.root.join("target").join("load");
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let script = out.join("load.lua");
    std::fs::write(&script, SCRIPT).with_context(|| format!("writing {}", script.display()))?;
    let mut rows = Vec::new();
    for connections in CONNECTIONS {
        for shed in [false, true] {
            let mode = if shed { "shed" } else { "no-shed" };
            println!("==> load: {mode}, {connections} connections, {seconds} s");
            let line = one(&exe, &script, shed, connections, seconds)?;
            let file = out.join(format!("{mode}-{connections}.json"));
            std::fs::write(&file, &line).with_context(|| format!("writing {}", file.display()))?;
            let run = parse(&line).with_context(|| format!("reading {}", file.display()))?;
            rows.push((shed, connections, run));
        }
    }
    println!();
    println!(
        "| line bound | connections | answers | waited the whole timeout | goodput (200/s) | \
         refusals p50 / p99 | successes p50 / p99 |"
    );
    println!("|---|---:|---|---:|---:|---|---|");
    let ms = |p: Option<(f64, f64)>| {
        p.map_or("-".to_owned(), |(p50, p99)| {
            format!("{p50:.1} / {p99:.1} ms")
        })
    };
    for (shed, connections, run) in &rows {
        let mut answers: Vec<String> = run
            .kinds
            .iter()
            .map(|k| format!("{} × {}", thousands(k.count), k.name))
            .collect();
        if run.cut > 0 {
            answers.push(format!("{} cut at the end", run.cut));
        }
        if run.socket_errors > 0 {
            answers.push(format!("{} socket errors", run.socket_errors));
        }
        println!(
            "| {} | {connections} | {} | {} | {:.2} | {} | {} |",
            if *shed { "expected wait 4.5 s" } else { "none" },
            answers.join(", "),
            run.count("503 timed_out"),
            run.ok.count as f64 / run.seconds,
            ms(run.refused.percentiles()),
            ms(run.ok.percentiles()),
        );
    }
    println!("(each run's figures: {})", out.display());
    Ok(ExitCode::SUCCESS)
}

/// One run: the example started on a free port, wrk against it, the example stopped; the
/// script's line of figures.
fn one(exe: &Path, script: &Path, shed: bool, connections: u32, seconds: u64) -> Result<String> {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .context("a free port")?
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut command = Command::new(exe);
    command.args(["--addr", &addr]);
    if !shed {
        command.arg("--no-shed");
    }
    let mut server = Server(
        command
            .stdout(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?,
    );
    let stdout = server.0.stdout.take().context("the example's stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    loop {
        match lines.next() {
            Some(Ok(line)) if line.starts_with("listening on") => break,
            Some(Ok(_)) => {}
            _ => bail!("the axum example exited before it listened"),
        }
    }
    let n = connections.to_string();
    let output = Command::new("wrk")
        .args(["-t", &n, "-c", &n, "-d", &format!("{seconds}s")])
        // Long enough that wrk counts every answer's latency (its default of 2 s drops those
        // past it from its own histogram; the script's own does not care).
        .args(["--timeout", "60s", "-s"])
        .arg(script)
        .arg(format!("http://{addr}/summarize?tokens=800"))
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .context("running wrk")?;
    if !output.status.success() {
        bail!("wrk failed ({})", output.status);
    }
    drop(server);
    let stdout = String::from_utf8(output.stdout).context("wrk's output is not UTF-8")?;
    stdout
        .lines()
        .find_map(|line| line.strip_prefix(PREFIX))
        .map(str::to_owned)
        .with_context(|| format!("wrk printed no `{PREFIX}` line:\n{stdout}"))
}

/// The example's process, killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The figures of one run from the script's JSON.
fn parse(json: &str) -> Result<Run> {
    let value: serde_json::Value = serde_json::from_str(json)?;
    let mut kinds = Vec::new();
    if let Some(answers) = value["answers"].as_object() {
        for (name, kind) in answers {
            kinds.push(Kind::read(name, kind)?);
        }
    }
    kinds.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.name.cmp(&b.name)));
    Ok(Run {
        seconds: value["seconds"].as_f64().context("no seconds")?,
        cut: value["cut"].as_u64().context("no cut")?,
        socket_errors: value["socket_errors"].as_u64().unwrap_or(0),
        kinds,
        refused: Kind::read("refused", &value["refused"])?,
        ok: Kind::read("ok", &value["ok"])?,
    })
}

/// `n` with a comma between thousands.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_read_from_the_scripts_line() {
        let json = r#"{"seconds": 20.004, "connections": 8, "cut": 3, "socket_errors": 0,
            "answers": {"200": {"count": 80, "p50_ms": 4.0, "p99_ms": 4900.0, "max_ms": 4990.0},
            "503 shed": {"count": 3000, "p50_ms": 1.2, "p99_ms": 3.1, "max_ms": 9.0},
            "503 timed_out": {"count": 7, "p50_ms": 5000.5, "p99_ms": 5010.0, "max_ms": 5011.0}},
            "refused": {"count": 3007, "p50_ms": 1.2, "p99_ms": 3.2, "max_ms": 5011.0},
            "ok": {"count": 80, "p50_ms": 4.0, "p99_ms": 4900.0, "max_ms": 4990.0}}"#;
        let run = parse(json).unwrap();
        let kind = |name: &str, count, p50_ms, p99_ms| Kind {
            name: name.into(),
            count,
            p50_ms,
            p99_ms,
        };
        assert_eq!(
            run,
            Run {
                seconds: 20.004,
                cut: 3,
                socket_errors: 0,
                kinds: vec![
                    kind("503 shed", 3000, 1.2, 3.1),
                    kind("200", 80, 4.0, 4900.0),
                    kind("503 timed_out", 7, 5000.5, 5010.0),
                ],
                refused: kind("refused", 3007, 1.2, 3.2),
                ok: kind("ok", 80, 4.0, 4900.0),
            }
        );
        assert_eq!(run.count("503 timed_out"), 7);
        assert_eq!(run.refused.percentiles(), Some((1.2, 3.2)));
        assert_eq!(kind("none", 0, 0.0, 0.0).percentiles(), None);
        assert!(parse("{}").is_err(), "no seconds");
        assert_eq!(thousands(1_747_785), "1,747,785");
        assert_eq!(thousands(999), "999");
    }
}
