//! Reading test counts out of the harnesses' own summary lines.
//!
//! Two formats are understood, one line at a time, and a step reads only its own harness's:
//!
//! - [`Format::Libtest`] (`cargo test`, doc tests included), once per test binary:
//!   `test result: ok. 12 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.01s`
//! - [`Format::Nextest`], once per run:
//!   `Summary [   1.234s] 42 tests run: 42 passed, 3 skipped`
//!
//! Keeping them apart matters: nextest runs each test through libtest and, for a failing or
//! retried test, prints that test's captured output, `test result:` line included; counting it
//! too would count the test twice.
//!
//! Colours are stripped before matching, so the counts survive `CARGO_TERM_COLOR=always`. Any other
//! line is ignored; a step whose output holds no such line simply has no count.

/// Which harness's summary lines a step's output is read for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    /// `cargo test`: one `test result:` line per test binary.
    Libtest,
    /// `cargo nextest run`: one `Summary [...]` line per run.
    Nextest,
}

/// The passed, failed and skipped tests read from one step's output.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Tally {
    /// Tests that passed, summed over every summary line seen.
    pub(crate) passed: u64,
    /// Tests that failed, summed over every summary line seen.
    pub(crate) failed: u64,
    /// Tests the runner did not run: ignored, or left out by its profile's filter (nextest's
    /// `skipped`, libtest's `ignored`).
    pub(crate) skipped: u64,
    /// How many summary lines contributed; zero means "nothing could be parsed".
    pub(crate) lines: u64,
}

impl Tally {
    /// Adds the counts of `line` if it is a summary line of `format`.
    pub(crate) fn observe(&mut self, format: Format, line: &str) {
        let line = strip_ansi(line);
        let counts = match format {
            Format::Libtest => libtest_result(&line),
            Format::Nextest => nextest_summary(&line),
        };
        if let Some((passed, failed, skipped)) = counts {
            self.passed += passed;
            self.failed += failed;
            self.skipped += skipped;
            self.lines += 1;
        }
    }

    /// Merges another step's tally into this one.
    pub(crate) fn add(&mut self, other: Tally) {
        self.passed += other.passed;
        self.failed += other.failed;
        self.skipped += other.skipped;
        self.lines += other.lines;
    }
}

/// `test result: ok. 12 passed; 0 failed; 1 ignored; ...` -> `(12, 0, 1)`.
fn libtest_result(line: &str) -> Option<(u64, u64, u64)> {
    let rest = line.trim_start().strip_prefix("test result: ")?;
    Some((
        number_before(rest, " passed")?,
        number_before(rest, " failed")?,
        number_before(rest, " ignored").unwrap_or(0),
    ))
}

/// `Summary [ 1.2s] 42 tests run: 40 passed, 2 failed, 3 skipped` -> `(40, 2, 3)`.
///
/// A run without failures has no `failed` field; a run cancelled early reads `3/42 tests run`.
fn nextest_summary(line: &str) -> Option<(u64, u64, u64)> {
    let rest = line.trim_start().strip_prefix("Summary [")?;
    let (_, rest) = rest.split_once(']')?;
    let (_, counts) = rest.split_once(" run:")?;
    let passed = number_before(counts, " passed")?;
    Some((
        passed,
        number_before(counts, " failed").unwrap_or(0),
        number_before(counts, " skipped").unwrap_or(0),
    ))
}

/// The decimal number written immediately before the first `marker` in `text`.
fn number_before(text: &str, marker: &str) -> Option<u64> {
    let head = &text[..text.find(marker)?];
    let digits = head.len() - head.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    head[head.len() - digits..].parse().ok()
}

/// Removes ANSI escape sequences (colours, styles) from `line`.
pub(crate) fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
        } else if chars.next_if_eq(&'[').is_some() {
            // CSI: parameters and intermediates, then one final byte in '@'..='~'.
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) {
                    break;
                }
            }
        } else {
            // A two-character escape such as `ESC (`: drop the byte after ESC too.
            chars.next();
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally(format: Format, lines: &[&str]) -> Tally {
        let mut tally = Tally::default();
        for line in lines {
            tally.observe(format, line);
        }
        tally
    }

    #[test]
    fn libtest_lines_are_summed_over_binaries() {
        let t = tally(
            Format::Libtest,
            &[
                "running 3 tests",
                "test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s",
                "",
                "test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 5 filtered out; finished in 0.00s",
                "test result: FAILED. 12 passed; 2 failed; 1 ignored; 0 measured; 0 filtered out; finished in 1.50s",
            ],
        );
        assert_eq!((t.passed, t.failed, t.lines), (15, 2, 3));
        assert_eq!(t.skipped, 1);
    }

    #[test]
    fn nextest_summary_without_failures_counts_zero_failed() {
        let t = tally(
            Format::Nextest,
            &[
                "    Starting 42 tests across 5 binaries (1 test skipped)",
                "     Summary [   1.234s] 42 tests run: 42 passed, 1 skipped",
            ],
        );
        assert_eq!((t.passed, t.failed, t.lines), (42, 0, 1));
        assert_eq!(t.skipped, 1);
    }

    #[test]
    fn nextest_summary_with_failures_and_flaky_tests() {
        let t = tally(
            Format::Nextest,
            &["     Summary [   0.010s] 10 tests run: 7 passed (1 flaky), 3 failed, 0 skipped"],
        );
        assert_eq!((t.passed, t.failed, t.lines), (7, 3, 1));
        assert_eq!(t.skipped, 0);
    }

    #[test]
    fn nextest_single_test_run() {
        let t = tally(
            Format::Nextest,
            &["     Summary [   0.003s] 1 test run: 1 passed, 0 skipped"],
        );
        assert_eq!((t.passed, t.failed, t.lines), (1, 0, 1));
    }

    #[test]
    fn coloured_lines_are_read_after_stripping() {
        let t = tally(
            Format::Nextest,
            &[
                "\u{1b}[32;1m     Summary\u{1b}[0m [   1.000s] \u{1b}[1m4\u{1b}[0m tests run: \u{1b}[1m4\u{1b}[0m \u{1b}[32;1mpassed\u{1b}[0m, \u{1b}[1m0\u{1b}[0m \u{1b}[33;1mskipped\u{1b}[0m",
            ],
        );
        assert_eq!((t.passed, t.failed, t.lines), (4, 0, 1));
    }

    #[test]
    fn other_lines_are_ignored() {
        let lines = [
            "test monitor::tests::head_is_never_overtaken ... ok",
            "   Compiling admission-core v0.1.0",
            "Summary of the design: 3 passed reviews",
            "error: test failed, to rerun pass `-p admission-core --lib`",
        ];
        for format in [Format::Libtest, Format::Nextest] {
            let t = tally(format, &lines);
            assert_eq!((t.passed, t.failed, t.lines), (0, 0, 0));
        }
    }

    #[test]
    fn nextest_step_ignores_the_libtest_lines_of_captured_output() {
        let t = tally(
            Format::Nextest,
            &[
                "        FAIL [   0.078s] ( 28/106) admission-core::it events::one",
                "    test result: FAILED. 0 passed; 1 failed; 0 ignored; 0 measured; 36 filtered out",
                "     Summary [   2.000s] 106 tests run: 105 passed, 1 failed, 0 skipped",
            ],
        );
        assert_eq!((t.passed, t.failed, t.lines), (105, 1, 1));
    }

    #[test]
    fn libtest_step_ignores_nextest_lines() {
        let t = tally(
            Format::Libtest,
            &["     Summary [   1.000s] 3 tests run: 3 passed, 0 skipped"],
        );
        assert_eq!((t.passed, t.failed, t.lines), (0, 0, 0));
    }

    #[test]
    fn strip_ansi_keeps_plain_text() {
        assert_eq!(strip_ansi("plain [text] 1;2m"), "plain [text] 1;2m");
        assert_eq!(strip_ansi("\u{1b}[1;31merror\u{1b}[0m: x"), "error: x");
    }
}
