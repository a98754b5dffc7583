//! `cargo xtask load [SECONDS]`: the axum example under a real load generator, with and
//! without its line bound, for BENCHMARKS.md.
//!
//! The example is built in release (`cargo build --release --example axum`), then for 8, 64 and
//! 256 connections it is started twice on a free loopback port, once with `--no-shed` (every
//! request waits up to the 5 s timeout: before) and once as it ships (a request the line ahead
//! would keep past the timeout is refused at once: after), and `oha` sends
//! `POST /summarize?tokens=800` over that many keep-alive connections for SECONDS (default 20):
//! `oha -z SECONDS -c N -m POST --no-tui --output-format json --stats-success-breakdown URL`. A fresh server each
//! time, so each run starts with the model's bucket full. The model admits a request of 1,000
//! tokens a second (60,000 a minute), so everything past that is refused: the question is how
//! soon.
//!
//! Per run it prints the answers by status, the goodput (200s a second of the run), and the
//! p50 and p99 latency of refusals (oha's not-successful breakdown: every non-2xx answer) and
//! of successes; each run's JSON is kept under `target/load/`. `oha` must be on PATH
//! (`cargo install oha`); this step is not part of `cargo xtask ci`.

use std::io::{BufRead as _, BufReader};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, ExitCode, Stdio};

use anyhow::{Context, Result, bail};

use crate::step::Workspace;

/// Connections per run.
const CONNECTIONS: [u32; 3] = [8, 64, 256];

/// One run's figures, from oha's JSON.
#[derive(Debug, PartialEq)]
struct Run {
    ok: u64,
    refused: u64,
    /// Requests oha aborted at the run's end (still waiting), and other errors.
    aborted: u64,
    seconds: f64,
    refused_ms: Option<(f64, f64)>,
    ok_ms: Option<(f64, f64)>,
    statuses: String,
}

pub(crate) fn run(ws: &Workspace, args: &[String]) -> Result<ExitCode> {
    let seconds: u64 = match args {
        [] => 20,
        [n] => n
            .parse()
            .ok()
            .filter(|n| *n > 0)
            .context("usage: cargo xtask load [SECONDS]")?,
        _ => bail!("usage: cargo xtask load [SECONDS]"),
    };
    let oha = Command::new("oha").arg("--version").output();
    if !oha.is_ok_and(|o| o.status.success()) {
        bail!("load: `oha` is not on PATH; install it with `cargo install oha`");
    }
    println!("==> load: cargo build --release --example axum");
    let exe = crate::chaos::build_example(ws, "axum")?;
    let out = ws.root.join("target").join("load");
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let mut rows = Vec::new();
    for connections in CONNECTIONS {
        for shed in [false, true] {
            let mode = if shed { "shed" } else { "no-shed" };
            println!("==> load: {mode}, {connections} connections, {seconds} s");
            let json = one(&exe, shed, connections, seconds)?;
            let file = out.join(format!("{mode}-{connections}.json"));
            std::fs::write(&file, &json).with_context(|| format!("writing {}", file.display()))?;
            let run =
                parse(&json).with_context(|| format!("reading oha's JSON ({})", file.display()))?;
            rows.push((mode, connections, run));
        }
    }
    println!();
    println!(
        "| line bound | connections | answers | goodput (200/s) | refusals p50 / p99 | successes p50 / p99 |"
    );
    println!("|---|---:|---|---:|---|---|");
    let ms = |p: Option<(f64, f64)>| {
        p.map_or("-".to_owned(), |(p50, p99)| {
            format!("{p50:.1} / {p99:.1} ms")
        })
    };
    for (mode, connections, run) in &rows {
        println!(
            "| {} | {connections} | {} | {:.2} | {} | {} |",
            if *mode == "shed" {
                "expected wait 5 s"
            } else {
                "none"
            },
            run.statuses,
            run.ok as f64 / run.seconds,
            ms(run.refused_ms),
            ms(run.ok_ms),
        );
    }
    println!("(oha's JSON of each run: {})", out.display());
    Ok(ExitCode::SUCCESS)
}

/// One run: the example started on a free port, oha against it, the example stopped; oha's
/// JSON.
fn one(exe: &Path, shed: bool, connections: u32, seconds: u64) -> Result<String> {
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
    let output = Command::new("oha")
        .args(["-z", &format!("{seconds}s"), "-c", &connections.to_string()])
        .args(["-m", "POST", "--no-tui", "--output-format", "json"])
        .arg("--stats-success-breakdown")
        .arg(format!("http://{addr}/summarize?tokens=800"))
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .context("running oha")?;
    if !output.status.success() {
        bail!("oha failed ({})", output.status);
    }
    drop(server);
    String::from_utf8(output.stdout).context("oha's output is not UTF-8")
}

/// The example's process, killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The figures of one run from oha's JSON (`oha --output-format json --stats-success-breakdown`).
fn parse(json: &str) -> Result<Run> {
    let value: serde_json::Value = serde_json::from_str(json)?;
    let mut ok = 0;
    let mut refused = 0;
    let mut statuses = Vec::new();
    if let Some(codes) = value["statusCodeDistribution"].as_object() {
        for (code, count) in codes {
            let count = count.as_u64().unwrap_or(0);
            if code.starts_with('2') {
                ok += count;
            } else {
                refused += count;
            }
            statuses.push((code.clone(), count));
        }
    }
    statuses.sort();
    let aborted = value["errorDistribution"].as_object().map_or(0, |e| {
        e.values().filter_map(serde_json::Value::as_u64).sum()
    });
    let seconds = value["summary"]["total"]
        .as_f64()
        .context("no summary.total")?;
    // oha 1.16 names the breakdowns `latencyPercentiles{Successful,NotSuccessful}`; its schema
    // of older versions says `latencyPercentile...`.
    let percentiles = |key: &str| {
        let p = value
            .get(format!("latencyPercentiles{key}"))
            .or_else(|| value.get(format!("latencyPercentile{key}")))?;
        Some((p["p50"].as_f64()? * 1e3, p["p99"].as_f64()? * 1e3))
    };
    let mut statuses: Vec<String> = statuses
        .into_iter()
        .map(|(code, count)| format!("{count} × {code}"))
        .collect();
    if aborted > 0 {
        statuses.push(format!("{aborted} cut at the end"));
    }
    Ok(Run {
        ok,
        refused,
        aborted,
        seconds,
        refused_ms: percentiles("NotSuccessful").filter(|_| refused > 0),
        ok_ms: percentiles("Successful").filter(|_| ok > 0),
        statuses: statuses.join(", "),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_read_from_ohas_json() {
        let json = r#"{
            "summary": {"total": 20.0},
            "statusCodeDistribution": {"503": 3000, "200": 80},
            "errorDistribution": {"aborted due to deadline": 64},
            "latencyPercentilesSuccessful": {"p50": 0.004, "p99": 4.9},
            "latencyPercentilesNotSuccessful": {"p50": 0.0012, "p99": 0.0031}
        }"#;
        let run = parse(json).unwrap();
        assert_eq!(
            run,
            Run {
                ok: 80,
                refused: 3000,
                aborted: 64,
                seconds: 20.0,
                refused_ms: Some((1.2, 3.1)),
                ok_ms: Some((4.0, 4900.0)),
                statuses: "80 × 200, 3000 × 503, 64 cut at the end".into(),
            }
        );
        assert!(parse("{}").is_err(), "no total");
    }
}
