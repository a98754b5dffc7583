//! Every benchmark of the workspace, each beside the peer it is measured against; see `benches/`
//! and BENCHMARKS.md.
//!
//! The side-by-side comparisons that `cargo xtask bench` runs and tabulates:
//!
//! - `side_by_side` (criterion): the single-limit take, the uncontended semaphore, three limits at
//!   once, and one evaluator pass over 10,000 parked waiters. Criterion writes its estimates under
//!   `target/criterion/`. Its contended semaphore (64 tasks) is a part of its own: runs of ours
//!   and tokio's interleaved, each with its wall time, CPU time and context switches ([`usage`]),
//!   written with [`Results`].
//! - `scarce_and_wakes` (its own harness): the quota a chain of limiters leaks, goodput under a
//!   scarce model, and wake-up latencies as percentiles. It writes one small JSON file per part
//!   under `target/side-by-side/` with [`Results`].
//!
//! The earlier criterion benches, run by `cargo xtask bench --all` (`cargo bench -p
//! admission-benches`): `monitor` (the uncontended path and its parts, the pass over parked
//! waiters, release to running), `gate_and_bucket`, `elastic_window` and `fixed_window` (each
//! family beside governor's `check_n`), `memory_gate` (what a green gate adds to an admit), and `db`
//! (the r2d2 SQLite provider of `admission-db` beside a bare checkout of the same pool), `redis`
//! (a fleet lease of `admission-redis` beside one FCALL of a function library of the same size) and
//! `redis_line` (its own harness: the fleet line's wake latency beside a 50 ms polling loop,
//! round trips per admitted job, the head's wait with and without small followers, and a
//! simulation of 100 processes on one cell and of cells sharded by hash tag). Both start a
//! private `redis-server` ([`redis_server`]).
//!
//! `monitor_lock` runs ours alone on the contended workloads and the uncontended gate and prints
//! each one's costs as a JSON line: `cargo xtask lock-bench` builds it once per monitor lock and
//! compares the two.
//!
//! `cargo xtask bench` rewrites the side-by-side table in BENCHMARKS.md from the files the first
//! two leave. This library holds [`Results`], what both sides of that exchange agree on,
//! [`support`], the loops the targets share, and [`usage`], what a piece of work cost the process.

use std::fmt::Write as _;
use std::path::PathBuf;

pub mod fairness;
pub mod redis_server;
pub mod support;
pub mod usage;

/// The directory the custom harness writes its results to: `$CARGO_TARGET_DIR/side-by-side`, or
/// `target/side-by-side` at the workspace root.
pub fn results_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .map_or_else(|| PathBuf::from("target"), |root| root.join("target"))
        });
    target.join("side-by-side")
}

/// One part's results: a flat JSON object of numbers and short texts, written to
/// `<results_dir>/<part>.json`.
#[derive(Debug)]
pub struct Results {
    part: String,
    fields: Vec<(String, Field)>,
}

#[derive(Debug)]
enum Field {
    Number(f64),
    Text(String),
}

impl Results {
    /// An empty record for `part` (the file's stem).
    pub fn new(part: &str) -> Results {
        Results {
            part: part.to_owned(),
            fields: Vec::new(),
        }
    }

    /// Adds a number (non-finite values are written as `null`).
    pub fn number(mut self, key: &str, value: f64) -> Results {
        self.fields.push((key.to_owned(), Field::Number(value)));
        self
    }

    /// Adds a text.
    pub fn text(mut self, key: &str, value: &str) -> Results {
        self.fields
            .push((key.to_owned(), Field::Text(value.to_owned())));
        self
    }

    /// The record as a JSON object, one field a line.
    pub fn to_json(&self) -> String {
        let mut out = String::from("{\n");
        for (i, field) in self.members().enumerate() {
            let comma = if i + 1 < self.fields.len() { "," } else { "" };
            let _ = writeln!(out, "  {field}{comma}");
        }
        out.push_str("}\n");
        out
    }

    /// The record as a JSON object on one line, without a line end.
    pub fn to_json_line(&self) -> String {
        let fields: Vec<String> = self.members().collect();
        format!("{{{}}}", fields.join(", "))
    }

    /// Each field as `"key": value`.
    fn members(&self) -> impl Iterator<Item = String> + '_ {
        self.fields.iter().map(|(key, field)| {
            let value = match field {
                Field::Number(n) if n.is_finite() => format!("{n}"),
                Field::Number(_) => "null".to_owned(),
                Field::Text(t) => quote(t),
            };
            format!("{}: {value}", quote(key))
        })
    }

    /// Writes the record to `<results_dir>/<part>.json` and returns the path.
    ///
    /// # Errors
    ///
    /// When the directory cannot be created or the file cannot be written.
    pub fn write(&self) -> std::io::Result<PathBuf> {
        let dir = results_dir();
        std::fs::create_dir_all(&dir)?;
        let path = dir.join(format!("{}.json", self.part));
        std::fs::write(&path, self.to_json())?;
        Ok(path)
    }
}

/// A JSON string literal.
fn quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_are_a_flat_json_object() {
        let json = Results::new("x")
            .number("a", 1.5)
            .number("b", f64::NAN)
            .text("c", "say \"hi\"\n")
            .to_json();
        assert_eq!(
            json,
            "{\n  \"a\": 1.5,\n  \"b\": null,\n  \"c\": \"say \\\"hi\\\"\\n\"\n}\n"
        );
        let line = Results::new("x").text("lock", "std").number("n", 3.0);
        assert_eq!(line.to_json_line(), "{\"lock\": \"std\", \"n\": 3}");
    }
}
