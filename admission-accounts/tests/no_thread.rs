//! The fixed window's async wait starts no thread and does not block inside `poll` (issue 38).
//!
//! The test counts the process's threads in `/proc/self/task` before async waits, while they are
//! pending and after they end, and asserts exact counts. That count needs a binary of its own
//! holding this one test: in the `it` binary, tests running beside this one start and end threads
//! of their own. The count's own check (a thread started is seen) comes first, and that thread is
//! joined only at the end: a thread just joined may linger in `/proc/self/task` for a moment after
//! `join` returns, so no count is asserted after a join.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use admission_accounts::fixed_window::{FixedWindow, FixedWindowError};
use admission_testkit::FakeClock;
use admission_testkit::monitor::poll_once;

const HOUR: Duration = Duration::from_secs(3_600);

/// Async waits pending at once: with a thread per waiting call (the former `ThreadSleeper`), as
/// many threads more.
const WAITERS: u64 = 8;

/// The threads this process runs now.
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("Linux lists a process's threads in /proc/self/task")
        .count()
}

#[test]
fn an_async_wait_starts_no_thread_and_never_blocks_in_poll() {
    let clock = FakeClock::new();
    let window = FixedWindow::of("sms", WAITERS, HOUR)
        .unwrap()
        .with_max_wait(HOUR * 2)
        .with_clock(clock.shared());
    for _ in 0..WAITERS {
        window.try_acquire().unwrap();
    }

    // The count sees a thread: one started, parked on a channel, is one more. It stays parked
    // until the end.
    let (release, parked) = mpsc::channel::<()>();
    let counted = threads();
    let extra = thread::spawn(move || parked.recv().ok());
    let before = threads();
    assert_eq!(before, counted + 1);

    // Where no runtime runs: the wait fails at once, with no thread to sleep on.
    for _ in 0..WAITERS {
        assert!(matches!(
            poll_once(&mut Box::pin(window.acquire_async())),
            Some(Err(FixedWindowError::NoTimer { .. }))
        ));
    }
    assert_eq!(threads(), before);
    assert_eq!(window.snapshot().used, WAITERS, "nothing taken");

    #[cfg(feature = "tokio")]
    {
        // On a current-thread runtime (which runs on this thread, on a paused clock): each first
        // poll registers the hour's sleep with tokio's timer and returns; a poll that slept the
        // hour would hang here.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("a current-thread runtime");
        assert_eq!(
            threads(),
            before,
            "a current-thread runtime starts no thread"
        );
        runtime.block_on(async {
            let mut waits: Vec<_> = (0..WAITERS)
                .map(|_| Box::pin(window.acquire_async()))
                .collect();
            for wait in &mut waits {
                assert!(poll_once(wait).is_none(), "waits for the next window");
            }
            assert_eq!(threads(), before, "no thread sleeps for the pending waits");
            clock.advance(HOUR);
            for wait in waits {
                assert_eq!(wait.await, Ok(()));
            }
        });
        assert_eq!(threads(), before);
        assert_eq!(
            window.snapshot().used,
            WAITERS,
            "every waiter in the next window"
        );

        // On a multi-thread runtime of two workers, the window spent again: its two workers, and
        // no thread more while the waits are pending (dropped, not awaited: nothing here sleeps
        // for real).
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .build()
            .expect("a multi-thread runtime");
        let with_workers = threads();
        assert_eq!(with_workers, before + 2, "the runtime's two workers");
        runtime.block_on(async {
            let mut waits: Vec<_> = (0..WAITERS)
                .map(|_| Box::pin(window.acquire_async()))
                .collect();
            for wait in &mut waits {
                assert!(poll_once(wait).is_none(), "waits for the next window");
            }
            assert_eq!(
                threads(),
                with_workers,
                "no thread sleeps for the pending waits"
            );
        });
        assert_eq!(
            window.snapshot().used,
            WAITERS,
            "the dropped waits took nothing"
        );
        drop(runtime);
    }

    release.send(()).unwrap();
    extra.join().unwrap();
}
