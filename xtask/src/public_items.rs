//! `cargo xtask public-items [--bless]`: each published library crate's public items, one per
//! line, checked against the committed list in `public-items/<crate>.txt`.
//!
//! A crate's list comes from its rustdoc JSON, built on stable in one `cargo doc` with the docs
//! step's arguments (FEATURES in `main.rs`, which turn on every feature of these crates) and its
//! target directory, rustdoc alone given `RUSTC_BOOTSTRAP=1` (see [`build_json`]) and
//! `-Z unstable-options --output-format json --document-hidden-items` (hidden items are public
//! API too), and is rendered by the
//! `public-api` crate: every public path with its kind and signature (`pub fn
//! admission_core::Monitor::new() -> admission_core::Monitor`), the impls a type has (the
//! derived and auto-trait ones too; blanket impls such as `impl<T> Any for T`, which follow from
//! the type alone, are left out), in `public-api`'s grouped order.
//!
//! Without `--bless` a list that differs from the committed one fails the command, with the
//! crate named and its added (`+`) and removed (`-`) lines shown; `--bless` writes the lists.
//! The lists are committed with the change that moved them, so a change of public API is seen
//! in review.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use anyhow::{Context, Result, bail};

use crate::step::Workspace;

/// The published library crates whose lists are kept (not the examples, benches or xtask).
pub(crate) const CRATES: &[&str] = &[
    "admission-core",
    "admission-accounts",
    "admission-llm",
    "admission-db",
    "admission-redis",
    "admission-events",
    "admission-tower",
    "admission-testkit",
];

/// The rustdoc JSON format the pinned `public-api` (0.52.1, over `rustdoc-types` 0.57) reads.
/// rustc 1.95 emits this one; a toolchain that emits another needs the `public-api` release
/// that reads it (its changelog names the nightly, its `rustdoc-types` dependency the format).
const FORMAT_VERSION: u64 = 57;

/// The directory of the committed lists, under the workspace root.
const LISTS_DIR: &str = "public-items";

/// Changed lines printed per crate; the rest are counted.
const MAX_SHOWN: usize = 60;

const USAGE: &str = "usage: cargo xtask public-items [--bless]";

/// Runs the command: checks every crate's list, or with `--bless` writes them.
pub(crate) fn run(ws: &Workspace, args: &[String]) -> Result<ExitCode> {
    let bless = match args {
        [] => false,
        [flag] if flag == "--bless" => true,
        _ => bail!("{USAGE}"),
    };
    let docs = build_json(ws)?;
    let lists_dir = ws.root.join(LISTS_DIR);
    let mut stale = Vec::new();
    for name in CRATES {
        let json = docs.join(format!("{}.json", name.replace('-', "_")));
        let items = render(&json).with_context(|| format!("listing {name}'s public items"))?;
        let path = lists_dir.join(format!("{name}.txt"));
        let committed = match std::fs::read_to_string(&path) {
            Ok(text) => Some(text),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
            Err(error) => {
                return Err(error).with_context(|| format!("could not read {}", path.display()));
            }
        };
        let count = items.lines().count();
        if committed.as_deref() == Some(items.as_str()) {
            println!("==> public items: {name}: {count} items, unchanged");
        } else if bless {
            std::fs::create_dir_all(&lists_dir)
                .with_context(|| format!("could not create {}", lists_dir.display()))?;
            std::fs::write(&path, &items)
                .with_context(|| format!("could not write {}", path.display()))?;
            println!("==> public items: {name}: {count} items, written to {LISTS_DIR}/{name}.txt");
        } else {
            let committed = committed.unwrap_or_default();
            eprint!("{}", report(name, &committed, &items));
            stale.push(*name);
        }
    }
    if !stale.is_empty() {
        bail!(
            "the public items of {} changed; if that is meant, run `cargo xtask public-items \
             --bless` and commit the lists in {LISTS_DIR}/ with the change",
            stale.join(", ")
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Builds every crate's rustdoc JSON in one `cargo doc`, with the docs step's own arguments and
/// target directory (so it reuses the dependencies that step and clippy checked), and returns the
/// directory the JSON files are in.
///
/// Rustdoc's JSON output is unstable: it needs `RUSTC_BOOTSTRAP=1`, but set for cargo it would
/// reach the build scripts that read it (proc-macro2's, anyhow's, ...) and rebuild a third of
/// the dependencies, twice. So only rustdoc gets it, through a wrapper (`RUSTDOC`): a two-line
/// script that sets it and runs the toolchain's own rustdoc.
fn build_json(ws: &Workspace) -> Result<PathBuf> {
    let target_dir = target_dir(ws)?;
    let wrapper_dir = target_dir.join("public-items");
    std::fs::create_dir_all(&wrapper_dir)
        .with_context(|| format!("could not create {}", wrapper_dir.display()))?;
    let rustdoc = toolchain_rustdoc(ws)?;
    let wrapper = wrapper_dir.join("rustdoc-bootstrap.sh");
    let script = format!(
        "#!/bin/sh\nRUSTC_BOOTSTRAP=1 exec {} \"$@\"\n",
        shell_word(&rustdoc.display().to_string())
    );
    std::fs::write(&wrapper, script)
        .with_context(|| format!("could not write {}", wrapper.display()))?;
    set_executable(&wrapper)?;
    let args = crate::docs_args();
    let status = Command::new(&ws.cargo)
        .args(&args)
        .current_dir(&ws.root)
        .env("RUSTDOC", &wrapper)
        .env(
            "RUSTDOCFLAGS",
            // `#[doc(hidden)]` items are public API all the same: they are listed too.
            "-Z unstable-options --output-format json --document-hidden-items",
        )
        .stdin(Stdio::null())
        .status()
        .with_context(|| format!("could not run cargo {}", args.join(" ")))?;
    if !status.success() {
        bail!(
            "building the rustdoc JSON failed ({status}): RUSTDOC={} RUSTDOCFLAGS='-Z \
             unstable-options --output-format json --document-hidden-items' cargo {}",
            wrapper.display(),
            args.join(" ")
        );
    }
    Ok(target_dir.join("doc"))
}

/// `$CARGO_TARGET_DIR` (made absolute: the commands run from the workspace root), else `target`
/// under the root.
fn target_dir(ws: &Workspace) -> Result<PathBuf> {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => std::path::absolute(Path::new(&dir))
            .with_context(|| format!("could not resolve {}", Path::new(&dir).display())),
        None => Ok(ws.root.join("target")),
    }
}

/// The rustdoc of the toolchain cargo runs (`rustc --print sysroot`), not a rustup proxy.
fn toolchain_rustdoc(ws: &Workspace) -> Result<PathBuf> {
    let output = Command::new("rustc")
        .args(["--print", "sysroot"])
        .current_dir(&ws.root)
        .output()
        .context("could not run rustc --print sysroot")?;
    if !output.status.success() {
        bail!("rustc --print sysroot failed ({})", output.status);
    }
    let sysroot = String::from_utf8(output.stdout).context("a sysroot that is not UTF-8")?;
    Ok(Path::new(sysroot.trim()).join("bin").join("rustdoc"))
}

fn set_executable(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .with_context(|| format!("could not make {} executable", path.display()))
}

/// `word` quoted for `sh`.
fn shell_word(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// The public items of the crate whose rustdoc JSON is at `json`, one per line, each line ended
/// by a newline.
fn render(json: &Path) -> Result<String> {
    let text = std::fs::read_to_string(json)
        .with_context(|| format!("could not read {}", json.display()))?;
    check_format_version(&text).with_context(|| json.display().to_string())?;
    let api = public_api::Builder::from_rustdoc_json(json)
        .omit_blanket_impls(true)
        .build()
        .with_context(|| format!("public-api could not read {}", json.display()))?;
    Ok(api
        .items()
        .map(|item| format!("{item}\n"))
        .filter(|line| !from_a_std_derive(line))
        .collect())
}

/// The items the standard library's derives add and hide (`#[derive(Eq)]`'s
/// `assert_fields_are_eq`, `#[derive(Clone)]`'s `TrivialClone` on a `Copy` type): hidden items
/// are listed, but these are std's, not ours, and move with the toolchain.
fn from_a_std_derive(line: &str) -> bool {
    line.ends_with("::assert_fields_are_eq(&self)\n")
        || (line.starts_with("impl") && line.contains(" core::clone::TrivialClone for "))
}

/// Fails unless the rustdoc JSON `text` is of [`FORMAT_VERSION`].
fn check_format_version(text: &str) -> Result<()> {
    let json: serde_json::Value = serde_json::from_str(text).context("not JSON")?;
    match json
        .get("format_version")
        .and_then(serde_json::Value::as_u64)
    {
        Some(FORMAT_VERSION) => Ok(()),
        Some(found) => bail!(
            "rustdoc JSON of format version {found}, but the public-api pinned in \
             xtask/Cargo.toml reads version {FORMAT_VERSION}: pin the public-api release that \
             reads {found} (and update FORMAT_VERSION in xtask/src/public_items.rs)"
        ),
        None => bail!("no `format_version` in the rustdoc JSON"),
    }
}

/// One line that differs between the committed list and the current one.
#[derive(Debug, PartialEq, Eq)]
enum Change<'a> {
    Removed(&'a str),
    Added(&'a str),
}

/// The lines of `old` that `new` lacks and those `new` has beyond `old` (counting repeats),
/// interleaved in list order: between two lines both lists keep, the removed ones come first.
/// A line that only moved is no change.
fn diff<'a>(old: &[&'a str], new: &[&'a str]) -> Vec<Change<'a>> {
    // Positive: that many copies removed; negative: that many added.
    let mut balance: HashMap<&str, i64> = HashMap::new();
    for line in old {
        *balance.entry(line).or_default() += 1;
    }
    for line in new {
        *balance.entry(line).or_default() -= 1;
    }
    let mut changes = Vec::new();
    let (mut i, mut j) = (0, 0);
    loop {
        while let Some(&line) = old.get(i)
            && take(&mut balance, line, 1)
        {
            changes.push(Change::Removed(line));
            i += 1;
        }
        while let Some(&line) = new.get(j)
            && take(&mut balance, line, -1)
        {
            changes.push(Change::Added(line));
            j += 1;
        }
        // Both lists now stand at a kept line; they hold the same number of those, so they run
        // out together.
        if i >= old.len() && j >= new.len() {
            return changes;
        }
        i += 1;
        j += 1;
    }
}

/// Moves `line`'s balance one step towards zero if it leans towards `sign`.
fn take(balance: &mut HashMap<&str, i64>, line: &str, sign: i64) -> bool {
    match balance.get_mut(line) {
        Some(n) if *n * sign > 0 => {
            *n -= sign;
            true
        }
        _ => false,
    }
}

/// The failure text for one crate: its name, the changed lines (at most [`MAX_SHOWN`]) and what
/// to do.
fn report(name: &str, committed: &str, current: &str) -> String {
    let old: Vec<&str> = committed.lines().collect();
    let new: Vec<&str> = current.lines().collect();
    let changes = diff(&old, &new);
    let added = changes
        .iter()
        .filter(|c| matches!(c, Change::Added(_)))
        .count();
    let removed = changes.len() - added;
    let mut out = format!(
        "==> public items: {name}: {added} added, {removed} removed against {LISTS_DIR}/{name}.txt\n\
         --- {LISTS_DIR}/{name}.txt (committed)\n\
         +++ {name} (as built now)\n"
    );
    if committed.is_empty() {
        let _ = writeln!(
            out,
            "(no committed list: {LISTS_DIR}/{name}.txt is missing or empty)"
        );
    }
    for change in changes.iter().take(MAX_SHOWN) {
        let _ = match change {
            Change::Removed(line) => writeln!(out, "-{line}"),
            Change::Added(line) => writeln!(out, "+{line}"),
        };
    }
    if changes.len() > MAX_SHOWN {
        let _ = writeln!(out, "... and {} more", changes.len() - MAX_SHOWN);
    }
    if changes.is_empty() {
        let _ = writeln!(out, "(the same items, in another order or layout)");
    }
    let _ = writeln!(
        out,
        "    accept with `cargo xtask public-items --bless` and commit {LISTS_DIR}/{name}.txt \
         with the change"
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    use Change::{Added, Removed};

    #[test]
    fn equal_lists_have_no_changes() {
        assert_eq!(diff(&["a", "b"], &["a", "b"]), vec![]);
        assert_eq!(diff(&[], &[]), vec![]);
    }

    #[test]
    fn an_added_and_a_removed_line_are_shown_in_list_order() {
        let old = [
            "pub mod m",
            "pub fn m::a()",
            "pub fn m::b()",
            "pub fn m::d()",
        ];
        let new = [
            "pub mod m",
            "pub fn m::b()",
            "pub fn m::c()",
            "pub fn m::d()",
        ];
        assert_eq!(
            diff(&old, &new),
            vec![Removed("pub fn m::a()"), Added("pub fn m::c()")]
        );
    }

    #[test]
    fn a_changed_signature_is_a_removal_then_an_addition() {
        let old = ["pub fn f(u32)", "pub fn g()"];
        let new = ["pub fn f(u64)", "pub fn g()"];
        assert_eq!(
            diff(&old, &new),
            vec![Removed("pub fn f(u32)"), Added("pub fn f(u64)")]
        );
    }

    #[test]
    fn an_empty_side_is_all_additions_or_all_removals() {
        assert_eq!(diff(&[], &["a", "b"]), vec![Added("a"), Added("b")]);
        assert_eq!(diff(&["a", "b"], &[]), vec![Removed("a"), Removed("b")]);
    }

    #[test]
    fn repeated_lines_are_counted() {
        assert_eq!(diff(&["x", "x", "y"], &["x", "y"]), vec![Removed("x")]);
        assert_eq!(diff(&["y"], &["x", "y", "x"]), vec![Added("x"), Added("x")]);
    }

    #[test]
    fn a_moved_line_is_no_change() {
        assert_eq!(diff(&["a", "b", "c"], &["b", "c", "a"]), vec![]);
    }

    #[test]
    fn report_names_the_crate_the_lines_and_the_command() {
        let text = report(
            "demo",
            "pub mod demo\npub fn demo::a()\n",
            "pub mod demo\npub fn demo::zz_probe()\n",
        );
        assert_eq!(
            text,
            "==> public items: demo: 1 added, 1 removed against public-items/demo.txt\n\
             --- public-items/demo.txt (committed)\n\
             +++ demo (as built now)\n\
             -pub fn demo::a()\n\
             +pub fn demo::zz_probe()\n    \
             accept with `cargo xtask public-items --bless` and commit public-items/demo.txt \
             with the change\n"
        );
    }

    #[test]
    fn report_stops_after_sixty_changed_lines() {
        let new: String = (0..65)
            .map(|i| format!("pub const demo::C{i:02}: u8\n"))
            .collect();
        let text = report("demo", "", &new);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[3],
            "(no committed list: public-items/demo.txt is missing or empty)"
        );
        assert_eq!(lines[4], "+pub const demo::C00: u8");
        assert_eq!(lines[63], "+pub const demo::C59: u8");
        assert_eq!(lines[64], "... and 5 more");
        assert_eq!(lines.len(), 66);
    }

    /// A crate `demo` of one module with one function, as rustdoc JSON of [`FORMAT_VERSION`].
    const DEMO_JSON: &str = r#"{
        "root": 0,
        "crate_version": "0.1.0",
        "includes_private": false,
        "index": {
            "0": {
                "id": 0, "crate_id": 0, "name": "demo", "span": null,
                "visibility": "public", "docs": null, "links": {}, "attrs": [],
                "deprecation": null,
                "inner": {"module": {"is_crate": true, "items": [1], "is_stripped": false}}
            },
            "1": {
                "id": 1, "crate_id": 0, "name": "admit", "span": null,
                "visibility": "public", "docs": null, "links": {}, "attrs": [],
                "deprecation": null,
                "inner": {"function": {
                    "sig": {
                        "inputs": [["units", {"primitive": "u32"}]],
                        "output": {"primitive": "bool"},
                        "is_c_variadic": false
                    },
                    "generics": {"params": [], "where_predicates": []},
                    "header": {"is_const": false, "is_unsafe": false, "is_async": false, "abi": "Rust"},
                    "has_body": true
                }}
            }
        },
        "paths": {
            "0": {"crate_id": 0, "path": ["demo"], "kind": "module"},
            "1": {"crate_id": 0, "path": ["demo", "admit"], "kind": "function"}
        },
        "external_crates": {},
        "target": {"triple": "x86_64-unknown-linux-gnu", "target_features": []},
        "format_version": 57
    }"#;

    #[test]
    fn a_small_crate_renders_as_its_items() {
        let dir = std::env::temp_dir().join(format!("xtask-public-items-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let json = dir.join("demo.json");
        std::fs::write(&json, DEMO_JSON).unwrap();
        let rendered = render(&json);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            rendered.unwrap(),
            "pub mod demo\npub fn demo::admit(u32) -> bool\n"
        );
    }

    #[test]
    fn another_format_version_is_refused() {
        let newer = DEMO_JSON.replace("\"format_version\": 57", "\"format_version\": 58");
        let error = check_format_version(&newer).unwrap_err().to_string();
        assert!(
            error.starts_with("rustdoc JSON of format version 58, but the public-api pinned"),
            "{error}"
        );
        assert!(check_format_version(DEMO_JSON).is_ok());
    }
}
