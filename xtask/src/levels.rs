//! `cargo xtask levels`: admission-core's files in four levels, checked from the sources (issue 38).
//!
//! Each file of `admission-core/src` sits at one level of [`LEVELS`]. The check fails when a file
//! imports from a file at a higher level, when one type's definition and `impl` blocks live in
//! files of different levels, and when files import each other in a circle. It reads every file
//! with `syn`, test modules and test hooks included (no `cfg` is evaluated), and counts as an
//! import every `use` leaf and every path in code or in a macro's tokens that starts with `crate`,
//! `super`, `self`, a child module or a name a `use` binds to a module. A path is followed through
//! re-exports (`use`, `pub use`, globs) to the file that defines the item, and every file whose
//! `use` it passes through is imported too (naming `crate::monitor::X` imports `monitor.rs`
//! wherever `X` lives). `lib.rs` only declares and re-exports: it is neither checked nor counted.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use proc_macro2::{TokenStream, TokenTree};
use syn::visit::{self, Visit};

use crate::step::{Step, Workspace};

/// The levels, lowest first: a name, and the files and folders (ending in `/`) of `src/` at that
/// level. A file no level names is at level 0.
const LEVELS: &[(&str, &[&str])] = &[
    ("vocabulary and contract", &[]),
    ("synchronization", &["sync.rs", "sync/"]),
    ("the state machine", &["machine.rs", "machine/"]),
    ("the shell", &["monitor.rs", "monitor/"]),
];

/// The crate root: declarations and re-exports only, at no level.
const ROOT: &str = "lib.rs";

/// The step in `cargo xtask ci`.
pub(crate) fn step() -> Step {
    Step::xtask("levels", &["levels"])
}

/// `cargo xtask levels`: prints the table, every finding and the summary line; fails on a finding.
pub(crate) fn run(ws: &Workspace, args: &[String]) -> Result<ExitCode> {
    if !args.is_empty() {
        bail!("`levels` takes no arguments, got {args:?}");
    }
    let src = ws.root.join("admission-core").join("src");
    let mut files = Vec::new();
    read_dir(&src, &src, &mut files)?;
    let report = check(&files)?;
    print!("{}", report.text);
    Ok(if report.findings == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Every `.rs` file under `dir`, as (path relative to `src`, text), sorted by path.
fn read_dir(src: &Path, dir: &Path, out: &mut Vec<(String, String)>) -> Result<()> {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.path());
    for path in entries.into_iter().map(|e| e.path()) {
        if path.is_dir() {
            read_dir(src, &path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            let name = path.strip_prefix(src)?.to_string_lossy().replace('\\', "/");
            out.push((name, fs::read_to_string(&path)?));
        }
    }
    Ok(())
}

/// The level of a file (`None` for the root).
fn level(file: &str) -> Option<usize> {
    (file != ROOT).then(|| {
        let at = |name: &&str| {
            name.strip_suffix('/')
                .map_or(file == *name, |dir| file.starts_with(&format!("{dir}/")))
        };
        LEVELS
            .iter()
            .rposition(|(_, names)| names.iter().any(at))
            .unwrap_or(0)
    })
}

/// The module a file holds: `machine/ask.rs` is `machine::ask`, `lib.rs` the root.
fn module_of(file: &str) -> Vec<String> {
    let stem = file.strip_suffix(".rs").unwrap_or(file);
    let stem = stem.strip_suffix("/mod").unwrap_or(stem);
    if stem == "lib" {
        Vec::new()
    } else {
        stem.split('/').map(String::from).collect()
    }
}

/// What one module (a file, or an inline `mod` in one) declares.
#[derive(Default)]
struct Module {
    file: usize,
    /// The items it defines and the modules it declares.
    items: BTreeSet<String>,
    /// Each name its `use`s bind, to the path as written.
    uses: BTreeMap<String, Vec<String>>,
    /// Its glob imports (`use a::*`), as written.
    globs: Vec<Vec<String>>,
}

impl Module {
    fn in_file(file: usize) -> Module {
        Module {
            file,
            ..Module::default()
        }
    }
}

/// A path written in a file, in a module.
struct Written {
    file: usize,
    line: usize,
    module: Vec<String>,
    path: Vec<String>,
    /// A `use` leaf (always followed), not a path in code.
    is_use: bool,
}

/// Where a path leads: the files whose `use`s it passes through, then the defining file; and
/// the item's name (`None` when it names a module).
struct Target {
    files: Vec<usize>,
    item: Option<String>,
}

/// The crate as read: its files, modules, written paths, `impl` self types and type definitions.
#[derive(Default)]
struct Crate {
    files: Vec<String>,
    modules: BTreeMap<Vec<String>, Module>,
    paths: Vec<Written>,
    impls: Vec<Written>,
    types: BTreeSet<(usize, String)>,
}

impl Crate {
    /// Follows `path`, written in `module`, to the files it leads to; `None` when it leaves the
    /// crate (`std::...`) or names nothing this reading knows.
    fn resolve(&self, module: &[String], path: &[String], depth: usize) -> Option<Target> {
        let mut at = module.to_vec();
        let mut rest = path;
        if matches!(rest.first()?.as_str(), "crate" | "self") {
            if rest[0] == "crate" {
                at.clear();
            }
            rest = &rest[1..];
        }
        while rest.first().is_some_and(|s| s == "super") {
            at.pop()?;
            rest = &rest[1..];
        }
        let mut files = Vec::new();
        for (i, name) in rest.iter().enumerate() {
            let child = [at.as_slice(), std::slice::from_ref(name)].concat();
            if self.modules.contains_key(&child) {
                at = child;
                continue;
            }
            let here = self.modules.get(&at)?;
            if here.items.contains(name) {
                files.push(here.file);
                return Some(Target {
                    files,
                    item: Some(name.clone()),
                });
            }
            let follow = |to: &[String]| {
                let next = [to, &rest[i + 1..]].concat();
                (depth < 16)
                    .then(|| self.resolve(&at, &next, depth + 1))
                    .flatten()
            };
            let through = here.uses.get(name).map(|to| {
                // A name re-exported from outside the crate ends at the file that re-exports it.
                follow(to).unwrap_or(Target {
                    files: Vec::new(),
                    item: Some(name.clone()),
                })
            });
            let through = through.or_else(|| {
                let globbed = |glob: &Vec<String>| {
                    follow(&[glob.as_slice(), std::slice::from_ref(name)].concat())
                };
                here.globs.iter().find_map(globbed)
            })?;
            files.push(here.file);
            files.extend(through.files);
            return Some(Target {
                files,
                item: through.item,
            });
        }
        files.push(self.modules.get(&at)?.file);
        Some(Target { files, item: None })
    }

    /// Whether a path in code is an import: it starts at the crate, a parent, this module, a
    /// child module, or a module a `use` binds (other paths' names came in by a `use` already).
    fn is_import(&self, w: &Written) -> bool {
        let first = w.path[0].as_str();
        w.is_use
            || matches!(first, "crate" | "super" | "self")
            || self
                .modules
                .contains_key(&[w.module.as_slice(), &w.path[..1]].concat())
            || self
                .modules
                .get(&w.module)
                .and_then(|m| m.uses.get(first))
                .is_some_and(|to| {
                    self.resolve(&w.module, to, 0)
                        .is_some_and(|t| t.item.is_none())
                })
    }
}

/// Reads the items, `use`s, paths and `impl`s of one file.
struct Reader<'a> {
    krate: &'a mut Crate,
    file: usize,
    module: Vec<String>,
}

impl Reader<'_> {
    fn here(&mut self) -> &mut Module {
        let file = self.file;
        let module = self.krate.modules.entry(self.module.clone());
        module.or_insert_with(|| Module::in_file(file))
    }

    fn written(&self, line: usize, path: Vec<String>, is_use: bool) -> Written {
        let (file, module) = (self.file, self.module.clone());
        Written {
            file,
            line,
            module,
            path,
            is_use,
        }
    }

    /// The leaves of a `use` tree: each binds a name (or is a glob) and is an import.
    fn use_tree(&mut self, tree: &syn::UseTree, prefix: &mut Vec<String>) {
        let with = |name: &syn::Ident| [prefix.as_slice(), &[name.to_string()]].concat();
        let (path, bound, span) = match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(&p.tree, prefix);
                prefix.pop();
                return;
            }
            syn::UseTree::Group(g) => {
                g.items.iter().for_each(|t| self.use_tree(t, prefix));
                return;
            }
            // `use a::{self}` binds `a`.
            syn::UseTree::Name(n) if n.ident == "self" => {
                (prefix.clone(), prefix.last().cloned(), n.ident.span())
            }
            syn::UseTree::Name(n) => (with(&n.ident), Some(n.ident.to_string()), n.ident.span()),
            syn::UseTree::Rename(r) => (with(&r.ident), Some(r.rename.to_string()), r.ident.span()),
            syn::UseTree::Glob(g) => (prefix.clone(), None, g.star_token.span),
        };
        match bound {
            Some(name) if name != "_" => {
                self.here().uses.insert(name, path.clone());
            }
            Some(_) => {}
            None => self.here().globs.push(path.clone()),
        }
        let written = self.written(span.start().line, path, true);
        self.krate.paths.push(written);
    }
}

impl<'ast> Visit<'ast> for Reader<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        use syn::Item;
        let (name, is_type) = match item {
            Item::Struct(i) => (Some(&i.ident), true),
            Item::Enum(i) => (Some(&i.ident), true),
            Item::Union(i) => (Some(&i.ident), true),
            Item::Type(i) => (Some(&i.ident), true),
            Item::Trait(i) => (Some(&i.ident), false),
            Item::Fn(i) => (Some(&i.sig.ident), false),
            Item::Const(i) => (Some(&i.ident), false),
            Item::Static(i) => (Some(&i.ident), false),
            Item::Macro(i) => (i.ident.as_ref(), false),
            Item::Mod(i) => (Some(&i.ident), false),
            _ => (None, false),
        };
        if let Some(name) = name {
            self.here().items.insert(name.to_string());
            if is_type {
                self.krate.types.insert((self.file, name.to_string()));
            }
        }
        visit::visit_item(self, item);
    }

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        self.module.push(item.ident.to_string());
        self.here();
        visit::visit_item_mod(self, item);
        self.module.pop();
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        self.use_tree(&item.tree, &mut Vec::new());
    }

    fn visit_item_impl(&mut self, item: &'ast syn::ItemImpl) {
        if let syn::Type::Path(syn::TypePath { qself: None, path }) = &*item.self_ty {
            let segments = path.segments.iter().map(|s| s.ident.to_string()).collect();
            let written = self.written(item.impl_token.span.start().line, segments, false);
            self.krate.impls.push(written);
        }
        visit::visit_item_impl(self, item);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() && path.segments.len() > 1 {
            let line = path.segments[0].ident.span().start().line;
            let segments = path.segments.iter().map(|s| s.ident.to_string()).collect();
            let written = self.written(line, segments, false);
            self.krate.paths.push(written);
        }
        visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.macro_tokens(mac.tokens.clone());
        visit::visit_macro(self, mac);
    }
}

impl Reader<'_> {
    /// The `a::b::c` sequences in a macro's tokens (which syn does not parse), `$crate::` too.
    fn macro_tokens(&mut self, tokens: TokenStream) {
        let tokens: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < tokens.len() {
            if let TokenTree::Group(group) = &tokens[i] {
                self.macro_tokens(group.stream());
            }
            let mut path = Vec::new();
            if let TokenTree::Ident(first) = &tokens[i] {
                path.push(first.to_string());
                while let [
                    TokenTree::Punct(a),
                    TokenTree::Punct(b),
                    TokenTree::Ident(next),
                    ..,
                ] = &tokens[i + 1..]
                {
                    if a.as_char() != ':' || b.as_char() != ':' {
                        break;
                    }
                    path.push(next.to_string());
                    i += 3;
                }
                if path.len() > 1 {
                    let written = self.written(first.span().start().line, path, false);
                    self.krate.paths.push(written);
                }
            }
            i += 1;
        }
    }
}

/// What `check` found: the report's text and the number of findings.
pub(crate) struct Report {
    pub(crate) text: String,
    pub(crate) findings: usize,
}

/// Checks a source tree given as (path relative to `src`, text) against [`LEVELS`].
pub(crate) fn check(sources: &[(String, String)]) -> Result<Report> {
    let mut krate = Crate {
        files: sources.iter().map(|(f, _)| f.clone()).collect(),
        ..Crate::default()
    };
    for (file, (name, _)) in sources.iter().enumerate() {
        krate.modules.insert(module_of(name), Module::in_file(file));
    }
    for (file, (name, text)) in sources.iter().enumerate() {
        let ast = syn::parse_file(text).with_context(|| format!("parsing {name}"))?;
        Reader {
            krate: &mut krate,
            file,
            module: module_of(name),
        }
        .visit_file(&ast);
    }
    let files = &krate.files;
    let root = files.iter().position(|f| f == ROOT);
    let lvl = |f: usize| level(&files[f]).unwrap_or(0);

    // Imports: (from, to) -> the first (line, path) that makes it.
    let mut imports: BTreeMap<(usize, usize), (usize, String)> = BTreeMap::new();
    let (mut upward, mut notes) = (Vec::new(), Vec::new());
    for w in krate
        .paths
        .iter()
        .filter(|w| Some(w.file) != root && krate.is_import(w))
    {
        let shown = w.path.join("::");
        let Some(target) = krate.resolve(&w.module, &w.path, 0) else {
            if matches!(w.path[0].as_str(), "crate" | "super") {
                notes.push(format!(
                    "note: {}:{}: `{shown}` not placed",
                    files[w.file], w.line
                ));
            }
            continue;
        };
        for to in target
            .files
            .into_iter()
            .filter(|&to| to != w.file && Some(to) != root)
        {
            imports
                .entry((w.file, to))
                .or_insert((w.line, shown.clone()));
            if lvl(to) > lvl(w.file) {
                let line = format!(
                    "upward: {}:{}: `{shown}` -> {} (level {} -> {})",
                    files[w.file],
                    w.line,
                    files[to],
                    lvl(w.file),
                    lvl(to)
                );
                if !upward.contains(&line) {
                    upward.push(line);
                }
            }
        }
    }

    // Split impls: a type whose definition and `impl`s are at more than one level.
    let mut impls: BTreeMap<(usize, String), Vec<(usize, usize)>> = BTreeMap::new();
    for w in &krate.impls {
        if let Some(Target {
            files: found,
            item: Some(name),
        }) = krate.resolve(&w.module, &w.path, 0)
            && let Some(&defined) = found.last()
            && krate.types.contains(&(defined, name.clone()))
        {
            impls
                .entry((defined, name))
                .or_default()
                .push((w.file, w.line));
        }
    }
    let mut split = Vec::new();
    for ((defined, name), at) in &impls {
        if at.iter().any(|&(f, _)| lvl(f) != lvl(*defined)) {
            let places: Vec<String> = at
                .iter()
                .map(|&(f, line)| format!("{}:{line} (level {})", files[f], lvl(f)))
                .collect();
            split.push(format!(
                "split impl: {name} (defined in {}, level {}): impl at {}",
                files[*defined],
                lvl(*defined),
                places.join(", ")
            ));
        }
    }

    // Circles: the strongly connected sets of files, found by who reaches whom.
    let reach: Vec<BTreeSet<usize>> = (0..files.len())
        .map(|start| {
            let (mut seen, mut todo) = (BTreeSet::new(), vec![start]);
            while let Some(at) = todo.pop() {
                for &(_, to) in imports.range((at, 0)..(at + 1, 0)).map(|(k, _)| k) {
                    if seen.insert(to) {
                        todo.push(to);
                    }
                }
            }
            seen
        })
        .collect();
    let mut circles: Vec<Vec<usize>> = Vec::new();
    for a in 0..files.len() {
        if reach[a].contains(&a) && !circles.iter().any(|c| c.contains(&a)) {
            circles.push(
                (0..files.len())
                    .filter(|&b| reach[a].contains(&b) && reach[b].contains(&a))
                    .collect(),
            );
        }
    }

    let mut text = String::from(
        "levels of admission-core/src (lib.rs declares and re-exports; not checked):\n",
    );
    for (at, (name, _)) in LEVELS.iter().enumerate() {
        let mine: Vec<&str> = files
            .iter()
            .filter(|f| level(f) == Some(at))
            .map(String::as_str)
            .collect();
        let count = |to: &dyn Fn(usize) -> bool| {
            imports
                .keys()
                .filter(|&&(a, b)| lvl(a) == at && Some(a) != root && to(lvl(b)))
                .count()
        };
        let _ = writeln!(
            text,
            "  {at} {name}: {} files, imports {} within, {} down, {} up: {}",
            mine.len(),
            count(&|b| b == at),
            count(&|b| b < at),
            count(&|b| b > at),
            mine.join(", ")
        );
    }
    for line in notes.iter().chain(&upward).chain(&split) {
        let _ = writeln!(text, "{line}");
    }
    for circle in &circles {
        let names: Vec<&str> = circle.iter().map(|&f| files[f].as_str()).collect();
        let _ = writeln!(
            text,
            "circle of {} files: {}",
            circle.len(),
            names.join(", ")
        );
        for (&(from, to), (line, path)) in imports
            .iter()
            .filter(|((a, b), _)| circle.contains(a) && circle.contains(b))
        {
            let _ = writeln!(
                text,
                "    {}:{line}: `{path}` -> {}",
                files[from], files[to]
            );
        }
    }
    let _ = writeln!(
        text,
        "levels: {} upward imports, {} circles, {} split impls",
        upward.len(),
        circles.len(),
        split.len()
    );
    Ok(Report {
        text,
        findings: upward.len() + circles.len() + split.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: &[(&str, &str)]) -> Report {
        let files: Vec<(String, String)> = files
            .iter()
            .map(|(f, t)| (f.to_string(), t.to_string()))
            .collect();
        check(&files).expect("the tree parses")
    }

    #[test]
    fn a_layered_tree_passes() {
        let report = tree(&[
            (
                "lib.rs",
                "mod contract; mod sync; mod machine; use contract::account; pub use machine::Machine;",
            ),
            ("contract.rs", "pub(crate) mod account;"),
            (
                "contract/account.rs",
                "pub struct Amount; impl Amount { fn zero() {} }",
            ),
            ("sync.rs", "pub(crate) struct Lock(crate::account::Amount);"),
            (
                "machine.rs",
                "mod line; pub struct Machine(line::Line, crate::sync::Lock);",
            ),
            (
                "machine/line.rs",
                "use super::super::account::Amount; pub(crate) struct Line(Amount);",
            ),
        ]);
        assert_eq!(report.findings, 0, "{}", report.text);
        assert!(
            report
                .text
                .ends_with("levels: 0 upward imports, 0 circles, 0 split impls\n"),
            "{}",
            report.text
        );
        assert!(
            report
                .text
                .contains("2 the state machine: 2 files, imports 1 within, 2 down, 0 up"),
            "{}",
            report.text
        );
    }

    #[test]
    fn an_upward_import_fails_in_use_test_code_macro_and_through_a_re_export() {
        let report = tree(&[
            ("lib.rs", "mod amount; mod sync; mod monitor;"),
            ("amount.rs", "pub struct Amount;"),
            (
                "monitor.rs",
                "pub(crate) use crate::amount::Amount; pub(crate) struct Hook;",
            ),
            (
                "sync.rs",
                "use crate::monitor::Amount;\n#[cfg(test)]\nmod tests {\n fn t() { let _ = super::super::monitor::Hook; assert!(matches!(1, crate::monitor::Hook)); }\n}",
            ),
        ]);
        assert_eq!(report.findings, 3, "{}", report.text);
        for line in [
            "upward: sync.rs:1: `crate::monitor::Amount` -> monitor.rs (level 1 -> 3)",
            "upward: sync.rs:4: `super::super::monitor::Hook` -> monitor.rs (level 1 -> 3)",
            "upward: sync.rs:4: `crate::monitor::Hook` -> monitor.rs (level 1 -> 3)",
        ] {
            assert!(
                report.text.contains(line),
                "{line} missing from\n{}",
                report.text
            );
        }
    }

    #[test]
    fn a_circle_fails_with_its_files() {
        let report = tree(&[
            ("lib.rs", "mod a; mod b; mod c;"),
            ("a.rs", "use crate::b::B; pub struct A;"),
            ("b.rs", "pub struct B(super::c::C);"),
            ("c.rs", "pub struct C(crate::a::A);"),
        ]);
        assert_eq!(report.findings, 1, "{}", report.text);
        assert!(
            report.text.contains("circle of 3 files: a.rs, b.rs, c.rs"),
            "{}",
            report.text
        );
        assert!(
            report.text.contains("    c.rs:1: `crate::a::A` -> a.rs"),
            "{}",
            report.text
        );
    }

    #[test]
    fn a_split_impl_fails() {
        let report = tree(&[
            ("lib.rs", "mod amount; mod machine;"),
            (
                "amount.rs",
                "pub struct Amount; impl Amount { fn zero() {} }",
            ),
            (
                "machine.rs",
                "use crate::amount::Amount;\nimpl Amount { fn twice(&self) {} }",
            ),
        ]);
        assert_eq!(report.findings, 1, "{}", report.text);
        assert!(report.text.contains("split impl: Amount (defined in amount.rs, level 0): impl at amount.rs:1 (level 0), machine.rs:2 (level 2)"), "{}", report.text);
    }

    #[test]
    fn every_file_has_its_level() {
        assert_eq!(level("lib.rs"), None);
        assert_eq!(level("contract/account.rs"), Some(0));
        assert_eq!(level("sync/holds.rs"), Some(1));
        assert_eq!(level("machine.rs"), Some(2));
        assert_eq!(level("monitor/shell.rs"), Some(3));
        assert_eq!(level("monitoring.rs"), Some(0));
    }
}
