//! `cargo xtask paths`: the admission-core files whose code runs on the two paths issue 38
//! counts, measured with callgrind rather than read off the code.
//!
//! The test-kit's `paths` example (`admission-testkit/examples/paths.rs`, dev build) runs a parked
//! `admit_blocking` inside `parked_admit` (the waiter's thread) and the release that wakes it
//! inside `waking_release` (the holder's), after a warm-up round under other names. It runs once
//! under `valgrind --tool=callgrind`, collecting inside those two functions only, one output
//! file per thread, each function named with its whole call stack (`--separate-callers`), names
//! and line numbers written out in full. A path's files are those of admission-core whose lines
//! run under its function, in the order a walk of the calls meets them (each function's lines
//! and calls in the order callgrind wrote them, which is the code's); the account's own `ask` is
//! not walked, and files outside admission-core are walked through but not listed. A file
//! "returns" when code of it runs while a call made from it is still running through another
//! admission-core file (a -> b -> a on one stack), inlined code included.
//!
//! ARCHITECTURE.md holds the measured lists in one marker, `<!-- paths: parked admit: a.rs, b.rs;
//! waking release: ... -->`; the command fails when they differ (files or order) or it is missing.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};

use anyhow::{Context, Result, bail};

use crate::services;
use crate::step::{Step, Workspace};

/// The paths: the name in the output and the marker, and the example's function that runs it.
const PATHS: &[(&str, &str)] = &[
    ("parked admit", "parked_admit"),
    ("waking release", "waking_release"),
];

/// Where admission-core's sources show in callgrind's file names.
const CORE: &str = "admission-core/src/";

/// The account's own `ask` (its `impl Account`, whatever calls it): not walked.
const ASK: &str = " as admission_core::contract::account::Account>::ask";

/// The step in `cargo xtask ci`.
pub(crate) fn step() -> Step {
    Step::xtask("paths", &["paths"])
}

/// `cargo xtask paths`: builds and measures the example, prints each path, checks the marker.
pub(crate) fn run(ws: &Workspace, args: &[String]) -> Result<ExitCode> {
    if !args.is_empty() {
        bail!("`paths` takes no arguments, got {args:?}");
    }
    if !services::binary_found("valgrind") {
        bail!("`paths` needs valgrind on PATH (apt-get install -y valgrind)");
    }
    let example = build_example(ws)?;
    let dir = std::env::temp_dir().join(format!("xtask-paths-{}", std::process::id()));
    fs::create_dir_all(&dir)?;
    let out = dir.join("callgrind.out");
    let output = Command::new("valgrind")
        .args([
            "--tool=callgrind",
            "--separate-threads=yes",
            "--separate-callers=200",
        ])
        .args(["--compress-strings=no", "--compress-pos=no"])
        .args(PATHS.iter().map(|(_, f)| format!("--toggle-collect=*{f}*")))
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(&example)
        .current_dir(&ws.root)
        .stdin(Stdio::null())
        .output()
        .context("could not run valgrind")?;
    let profiles: Result<Vec<Profile>> = fs::read_dir(&dir)?
        .map(|entry| Ok(Profile::parse(&fs::read_to_string(entry?.path())?)))
        .collect();
    let _ = fs::remove_dir_all(&dir);
    if !output.status.success() {
        eprint!("{}", String::from_utf8_lossy(&output.stderr));
        bail!("the paths example under callgrind: {}", output.status);
    }
    let profiles = profiles?;

    let architecture = fs::read_to_string(ws.root.join("ARCHITECTURE.md"))?;
    let listed = marker(&architecture);
    let mut ok = true;
    for (name, function) in PATHS {
        let walk = profiles
            .iter()
            .find_map(|p| p.walk(function))
            .with_context(|| format!("no thread ran `{function}`"))?;
        let returns = match walk.returns.len() {
            0 => "no return".to_string(),
            n => format!("{n} returns:"),
        };
        let files = walk.files.join(", ");
        println!(
            "paths: {name}: {} files: {files}; {returns}",
            walk.files.len()
        );
        for back in &walk.returns {
            println!("    {back}");
        }
        match listed.iter().find(|(n, _)| n == name) {
            Some((_, files)) if *files == walk.files => {}
            Some((_, files)) => {
                ok = false;
                println!(
                    "paths: {name}: ARCHITECTURE.md's marker lists {}",
                    files.join(", ")
                );
            }
            None => {
                ok = false;
                println!(
                    "paths: {name}: ARCHITECTURE.md has no `<!-- paths: {name}: ... -->` list"
                );
            }
        }
    }
    println!(
        "paths: ARCHITECTURE.md's marker {}",
        if ok { "agrees" } else { "differs" }
    );
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Builds the example in the dev profile with the tests step's features (`cargo build --workspace
/// FEATURES --example paths`), so that after the tests step nothing is built again; its path.
fn build_example(ws: &Workspace) -> Result<PathBuf> {
    let args = crate::with_features(
        &["build", "--workspace", "--example", "paths"],
        &["--message-format=json-render-diagnostics"],
    );
    let output = Command::new(&ws.cargo)
        .args(&args)
        .current_dir(&ws.root)
        .stderr(Stdio::inherit())
        .output()
        .context("could not run cargo build")?;
    if !output.status.success() {
        bail!("cargo {} failed ({})", args.join(" "), output.status);
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "paths")
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .context("cargo built no `paths` example")
}

/// The marker's lists: `<!-- paths: NAME: a.rs, b.rs; NAME: ... -->` as (NAME, files).
fn marker(text: &str) -> Vec<(String, Vec<String>)> {
    let Some(inner) = text
        .split("<!-- paths:")
        .nth(1)
        .and_then(|rest| rest.split("-->").next())
    else {
        return Vec::new();
    };
    inner
        .split(';')
        .filter_map(|path| {
            let (name, files) = path.split_once(':')?;
            let files = files
                .split(',')
                .map(|f| f.trim().to_string())
                .filter(|f| !f.is_empty());
            Some((
                name.split_whitespace().collect::<Vec<_>>().join(" "),
                files.collect(),
            ))
        })
        .collect()
}

/// One line of a function's costs: its file and line, and the function it calls there, if any.
struct Cost {
    file: String,
    line: u64,
    call: Option<String>,
}

/// One callgrind output file (one thread's): each function (named with its callers) and its
/// lines, in the order written.
struct Profile(HashMap<String, Vec<Cost>>);

/// What a walk of one path found: files in order, and each return as `a -> b -> a`.
#[derive(Default)]
struct Walk {
    files: Vec<String>,
    returns: Vec<String>,
}

impl Profile {
    /// Reads a file written with `--compress-strings=no --compress-pos=no`: `fl=` names the file
    /// of the function `fn=` opens, `fi=`/`fe=` that of inlined code, `cfn=` and `calls=` a call
    /// whose position line follows; a cost line is `LINE COST`.
    fn parse(text: &str) -> Profile {
        let (mut profile, mut function, mut fl, mut file) = (HashMap::new(), "", "", "");
        let mut callee = None;
        let mut lines = text.lines();
        while let Some(line) = lines.next() {
            let mut call = None;
            let cost_line = if let Some(name) = line.strip_prefix("fl=") {
                (fl, file) = (name, name);
                continue;
            } else if let Some(name) = line
                .strip_prefix("fi=")
                .or_else(|| line.strip_prefix("fe="))
            {
                file = name;
                continue;
            } else if let Some(name) = line.strip_prefix("fn=") {
                (function, file) = (name, fl);
                continue;
            } else if let Some(name) = line.strip_prefix("cfn=") {
                callee = Some(name.to_string());
                continue;
            } else if line.starts_with("calls=") {
                call = callee.take();
                lines.next().unwrap_or_default()
            } else {
                line
            };
            if let Some(Ok(number)) = cost_line.split_whitespace().next().map(str::parse) {
                let cost = Cost {
                    file: file.to_string(),
                    line: number,
                    call,
                };
                profile
                    .entry(function.to_string())
                    .or_insert_with(Vec::new)
                    .push(cost);
            }
        }
        Profile(profile)
    }

    /// The walk from the function named `root` (the example's `paths::root`), if it ran here.
    fn walk(&self, root: &str) -> Option<Walk> {
        let suffix = format!("::{root}");
        let start = self.0.keys().find(|name| {
            name.split('\'')
                .next()
                .is_some_and(|n| n.ends_with(&suffix))
        })?;
        let mut walk = Walk::default();
        self.visit(start, &mut Vec::new(), &mut HashSet::new(), &mut walk);
        Some(walk)
    }

    /// Walks `function`'s lines, `chain` holding the admission-core file and function of each
    /// call still running (one entry for consecutive calls from one file).
    fn visit<'a>(
        &'a self,
        function: &'a str,
        chain: &mut Vec<(String, &'a str)>,
        active: &mut HashSet<&'a str>,
        walk: &mut Walk,
    ) {
        if !active.insert(function) {
            return;
        }
        for cost in self.0.get(function).into_iter().flatten() {
            let file = cost.file.rfind(CORE).filter(|_| cost.line > 0);
            let file = file.map(|at| cost.file[at + CORE.len()..].to_string());
            if let Some(file) = &file {
                if !walk.files.contains(file) {
                    walk.files.push(file.clone());
                }
                if chain.last().is_some_and(|(last, _)| last != file)
                    && let Some(at) = chain.iter().rposition(|(f, _)| f == file)
                {
                    let end = (file.clone(), function);
                    let steps = chain[at..].iter().chain([&end]);
                    let back: Vec<String> =
                        steps.map(|(f, n)| format!("{f} ({})", short(n))).collect();
                    let back = back.join(" -> ");
                    if !walk.returns.contains(&back) {
                        walk.returns.push(back);
                    }
                }
            }
            let Some(callee) = cost.call.as_deref().filter(|c| !c.contains(ASK)) else {
                continue;
            };
            let from = file.filter(|f| chain.last().is_none_or(|(last, _)| last != f));
            let pushed = from.map(|f| chain.push((f, function))).is_some();
            self.visit(callee, chain, active, walk);
            if pushed {
                chain.pop();
            }
        }
        active.remove(function);
    }
}

/// A function's name without its callers and the crate's own prefix.
fn short(function: &str) -> String {
    function
        .split('\'')
        .next()
        .unwrap_or(function)
        .replace("admission_core::", "")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marker_reads_both_lists() {
        let text = "x\n<!-- paths: parked admit: monitor.rs, machine.rs;\n  waking release: monitor/grant.rs -->\n";
        assert_eq!(
            marker(text),
            vec![
                (
                    "parked admit".to_string(),
                    vec!["monitor.rs".to_string(), "machine.rs".to_string()]
                ),
                (
                    "waking release".to_string(),
                    vec!["monitor/grant.rs".to_string()]
                ),
            ]
        );
        assert!(marker("no marker").is_empty());
    }

    /// A cut-down profile: `root` runs a.rs, calls b.rs's `g` (inlined c.rs code in it), which
    /// calls std's `h`, which calls a.rs's `k` (a return to a.rs), then calls the account's `ask`
    /// (not walked).
    #[test]
    fn a_walk_lists_files_in_order_and_finds_a_return() {
        let text = "\
fl=/w/ex/paths.rs
fn=paths::root'main
1 5
cfn=g'paths::root'main
calls=1 10
2 50
fl=/w/admission-core/src/a.rs
fn=a::k'h'g'paths::root'main
7 3
fl=/w/admission-core/src/b.rs
fn=g'paths::root'main
10 4
fi=/w/admission-core/src/c.rs
3 1
fe=/w/admission-core/src/b.rs
cfn=h'g'paths::root'main
calls=1 1
11 20
cfn=<t::P as admission_core::contract::account::Account>::ask'g'paths::root'main
calls=1 1
12 20
fl=/rustc/library/core/src/x.rs
fn=h'g'paths::root'main
1 1
cfn=a::k'h'g'paths::root'main
calls=1 7
2 3
fn=<t::P as admission_core::contract::account::Account>::ask'g'paths::root'main
fl=/w/admission-core/src/d.rs
1 9
";
        let walk = Profile::parse(text).walk("root").expect("root ran");
        assert_eq!(walk.files, ["b.rs", "c.rs", "a.rs"]);
        assert!(walk.returns.is_empty(), "{:?}", walk.returns);

        // Now a.rs calls b.rs first: code of a.rs under b.rs is a return.
        let text = text.replace(
            "1 5\ncfn=g",
            "1 5\nfi=/w/admission-core/src/a.rs\n1 1\ncfn=g",
        );
        let walk = Profile::parse(&text).walk("root").expect("root ran");
        assert_eq!(walk.files, ["a.rs", "b.rs", "c.rs"]);
        assert_eq!(
            walk.returns,
            ["a.rs (paths::root) -> b.rs (g) -> a.rs (a::k)"]
        );
    }
}
