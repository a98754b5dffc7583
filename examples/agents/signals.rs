//! Stopping cleanly: the signals a run answers (SIGINT, SIGTERM), and the pipe from a `--fleet`
//! parent to each of its members, through which the parent forwards the signal it got and whose
//! closing tells a member that its parent is gone.
//!
//! A member's stdin is a pipe from its parent. Asked to stop, the parent writes one line,
//! `stop SIGTERM` (or `stop SIGINT`), and closes the pipe; when the parent dies, however it dies
//! (SIGKILL included), the kernel closes the pipe for it. Either way the member triggers its
//! interrupt: its jobs are cancelled through their `JobContext`s, lease waits withdrawn, leases
//! released, and it prints its report and exits. The pipe needs no signal-sending call in the
//! parent and no platform call in the member, and a parent that died before the member looked
//! is not missed: the end of the pipe waits to be read.

use std::io::{BufRead as _, Write as _};
use std::process::ChildStdin;
use std::sync::Arc;

use crate::stop::Stop;

/// The word that starts the line a parent writes to stop a member.
const STOP_WORD: &str = "stop";

/// The signals this process answers, caught from the moment this is made (inside a tokio
/// runtime): from then on they no longer end the process.
pub struct Signals {
    #[cfg(unix)]
    caught: Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>,
}

impl Signals {
    /// Starts catching SIGINT and SIGTERM. Must be called inside a tokio runtime.
    pub fn new() -> Signals {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Signals {
                caught: signal(SignalKind::interrupt())
                    .and_then(|interrupt| Ok((interrupt, signal(SignalKind::terminate())?)))
                    .ok(),
            }
        }
        #[cfg(not(unix))]
        Signals {}
    }

    /// The next signal's name (`SIGINT`, `SIGTERM`); `None` when no signal can be caught.
    pub async fn next(&mut self) -> Option<&'static str> {
        #[cfg(unix)]
        {
            let (interrupt, terminate) = self.caught.as_mut()?;
            tokio::select! {
                got = interrupt.recv() => got.map(|()| "SIGINT"),
                got = terminate.recv() => got.map(|()| "SIGTERM"),
            }
        }
        #[cfg(not(unix))]
        tokio::signal::ctrl_c().await.ok().map(|()| "SIGINT")
    }
}

/// The first SIGINT or SIGTERM triggers `interrupt` (the run stops cleanly and still reports);
/// a second exits at once.
pub async fn listen(interrupt: Arc<Stop>) {
    let mut signals = Signals::new();
    let Some(first) = signals.next().await else {
        return;
    };
    eprintln!("\n{first}: cancelling every agent (send it again to quit at once)");
    interrupt.trigger(first);
    if signals.next().await.is_some() {
        std::process::exit(130);
    }
}

/// In a member: triggers `interrupt` when the parent writes its stop line or the pipe closes.
pub fn watch_parent(interrupt: Arc<Stop>) {
    let watcher = move || {
        let mut line = String::new();
        let reason = match std::io::stdin().lock().read_line(&mut line) {
            Ok(0) | Err(_) => "the fleet's parent went away (its pipe closed)".to_owned(),
            Ok(_) => stop_reason(&line),
        };
        interrupt.trigger(&reason);
    };
    // Without the thread the member would not notice its parent's end: say so, and run on.
    if let Err(error) = std::thread::Builder::new()
        .name("fleet-parent".into())
        .spawn(watcher)
    {
        eprintln!("warning: cannot watch the fleet's parent: {error}");
    }
}

/// The interrupt's reason for a line the parent wrote.
fn stop_reason(line: &str) -> String {
    match line.trim().strip_prefix(STOP_WORD).map(str::trim) {
        Some(signal) if !signal.is_empty() => format!("the fleet's parent forwarded {signal}"),
        _ => "the fleet's parent asked it to stop".to_owned(),
    }
}

/// In the parent: forwards `signal` to a member through its pipe, and closes the pipe. A member
/// that already exited is not an error.
pub fn forward(pipe: ChildStdin, signal: &str) {
    let mut pipe = pipe;
    let _ = writeln!(pipe, "{STOP_WORD} {signal}");
    drop(pipe);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_line_names_the_forwarded_signal() {
        assert_eq!(
            stop_reason("stop SIGTERM\n"),
            "the fleet's parent forwarded SIGTERM"
        );
        assert_eq!(stop_reason("stop\n"), "the fleet's parent asked it to stop");
        assert_eq!(
            stop_reason("garbage"),
            "the fleet's parent asked it to stop"
        );
    }
}
