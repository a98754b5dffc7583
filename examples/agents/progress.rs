//! The live display: an indicatif bar on a terminal (jobs done, the line's length, connections in
//! use, each model's throttle), plain periodic lines when stdout is not a terminal (CI logs).

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::timeline::{Sample, Timeline};

/// How often a plain line is printed.
const PLAIN_EVERY: Duration = Duration::from_secs(2);

/// The display of one run.
pub enum Progress {
    /// A terminal: one bar redrawn in place.
    Bar(ProgressBar),
    /// Not a terminal: a line every [`PLAIN_EVERY`].
    Plain {
        /// The run's name, prefixed to each line.
        label: String,
        /// When the last line was printed.
        last: Instant,
        /// Jobs in the run.
        total: u64,
    },
}

impl Progress {
    /// A display for a run named `label` of `total` jobs.
    pub fn new(label: &str, total: u64) -> Progress {
        if std::io::stdout().is_terminal() {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stdout());
            let style = ProgressStyle::with_template(
                "{prefix:>13} [{bar:20.cyan/blue}] {pos}/{len} jobs | {wide_msg}",
            )
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            bar.set_prefix(label.to_owned());
            Progress::Bar(bar)
        } else {
            crate::say(&format!("{label}: {total} jobs started"));
            Progress::Plain {
                label: label.to_owned(),
                last: Instant::now(),
                total,
            }
        }
    }

    /// Shows the latest sample.
    pub fn update(&mut self, timeline: &Timeline, sample: &Sample, done: u64) {
        let message = describe(timeline, sample);
        match self {
            Progress::Bar(bar) => {
                bar.set_position(done);
                bar.set_message(message);
            }
            Progress::Plain { label, last, total } => {
                if last.elapsed() >= PLAIN_EVERY {
                    *last = Instant::now();
                    crate::say(&format!("{label}: {done}/{total} jobs done | {message}"));
                }
            }
        }
    }

    /// Clears the bar (the summary follows).
    pub fn finish(&mut self) {
        if let Progress::Bar(bar) = self {
            bar.finish_and_clear();
        }
    }
}

/// `sim 4m10s | line 123 | throttle model-a 1.5x ... | http 32/32 db 8/8 ...`
fn describe(timeline: &Timeline, sample: &Sample) -> String {
    let mut parts = vec![
        format!("sim {}", clock_text(sample.t)),
        format!("line {}", sample.line),
    ];
    let throttles: Vec<String> = timeline
        .models
        .iter()
        .zip(&sample.throttles)
        .map(|(model, t)| format!("{model} {:.1}x", 1.0 + t))
        .collect();
    parts.push(format!("throttle {}", throttles.join(" ")));
    let gates: Vec<String> = timeline
        .names
        .iter()
        .zip(&sample.accounts)
        .filter(|((_, unit), _)| crate::timeline::is_held(unit))
        .map(|((name, _), (in_use, capacity))| format!("{name} {in_use}/{capacity}"))
        .collect();
    parts.push(gates.join(" "));
    parts.join(" | ")
}

/// Simulated seconds as `4m10s`.
pub fn clock_text(seconds: f64) -> String {
    let whole = seconds.max(0.0).round() as u64;
    format!("{}m{:02}s", whole / 60, whole % 60)
}
