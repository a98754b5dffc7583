//! The counts ARCHITECTURE.md gives are the code's: the rules of the two contract suites and the
//! loom models. A rule or a model added without the page is a failure here.

/// The number written between `before` and `after` in the page, its lines joined (so a reflowed
/// paragraph still reads the same).
fn number_in(page: &str, before: &str, after: &str) -> usize {
    let page = page.split_whitespace().collect::<Vec<_>>().join(" ");
    let start = page
        .find(before)
        .unwrap_or_else(|| panic!("ARCHITECTURE.md no longer says {before:?}"))
        + before.len();
    let rest = &page[start..];
    let end = rest
        .find(after)
        .unwrap_or_else(|| panic!("ARCHITECTURE.md no longer says {before:?} ... {after:?}"));
    rest[..end].trim().parse().unwrap_or_else(|_| {
        panic!(
            "not a number between {before:?} and {after:?}: {:?}",
            &rest[..end]
        )
    })
}

const PAGE: &str = include_str!("../../../ARCHITECTURE.md");

#[test]
fn the_contract_suites_have_the_rules_the_page_counts() {
    assert_eq!(
        number_in(PAGE, "(the account contract suite: ", " rules"),
        admission_testkit::contract::RULES.len()
    );
    assert_eq!(
        number_in(PAGE, "(the gate contract suite: ", " rules"),
        admission_testkit::gate_contract::RULES.len()
    );
}

#[test]
fn the_loom_models_are_as_many_as_the_page_says() {
    let models = include_str!("../../../admission-core/src/monitor/loom_models.rs")
        .matches("loom::model(")
        .count();
    assert_eq!(
        number_in(
            PAGE,
            "`loom_models.rs` the loom models (",
            ", at preemption"
        ),
        models
    );
}
