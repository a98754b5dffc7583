//! The crate's layering, read from its sources (as rust-analyzer's tidy tests read theirs): the
//! account-author interface depends on nothing of the engine.

use std::path::Path;

/// Code (not comments) in `src/contract.rs` and `src/contract/` that names the engine.
fn engine_names_in_the_contract() -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = vec![src.join("contract.rs")];
    let dir = std::fs::read_dir(src.join("contract")).expect("src/contract exists");
    files.extend(dir.map(|entry| entry.expect("a directory entry").path()));
    files.sort();
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("a source file");
        for (number, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            if ["monitor", "evaluator"]
                .iter()
                .any(|name| code.contains(name))
            {
                found.push(format!(
                    "{}:{}: {}",
                    file.display(),
                    number + 1,
                    line.trim()
                ));
            }
        }
    }
    found
}

#[test]
fn the_contract_module_never_names_the_engine() {
    assert_eq!(engine_names_in_the_contract(), Vec::<String>::new());
}
