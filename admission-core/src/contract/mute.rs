//! Muting a wake-up callback on this thread: how a monitor's hand-off keeps the accounts it gives
//! back to from waking its own evaluator.
//!
//! A thread that gives a grant back runs that monitor's pass right after (`monitor/release.rs`),
//! and the pass covers every waiter of that monitor; the wake-ups the accounts send while taking
//! the give (through their [`WakeSlot`](crate::WakeSlot)s) would only wake its evaluator for a
//! second, useless pass. So the giver names that monitor's callback, by key, as muted on its
//! thread for the time of the give, and a [`WakeSlot::notify`](crate::WakeSlot::notify) holding
//! that very callback skips the call. Another monitor's callback, reached through an account the two
//! share, is not muted.
//!
//! This module sits on the account side of the crate: the wake slot reads it, and the monitor's
//! engine (the evaluator's doorbell) sets it; it depends on neither.

use std::cell::Cell;

use crate::clock::WakeFn;

#[cfg(not(admission_loom))]
std::thread_local! {
    /// The key ([`wake_key`]) of the callback muted on this thread; 0 for none. Initialized
    /// constantly, so a read is one load (no first-use check).
    static MUTED: Cell<usize> = const { Cell::new(0) };
}

#[cfg(admission_loom)]
loom::thread_local! {
    // loom's `thread_local!` does not accept the `const` form.
    #[allow(clippy::missing_const_for_thread_local)]
    static MUTED: Cell<usize> = Cell::new(0);
}

/// Runs `f` with the callback of key `key` muted on this thread; the previous key is restored
/// afterwards, even if `f` panics.
#[inline]
pub(crate) fn muting(key: usize, f: impl FnOnce()) {
    struct Restore(usize);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0;
            MUTED.with(|m| m.set(previous));
        }
    }
    let _restore = Restore(MUTED.with(|m| m.replace(key)));
    f();
}

/// The key of the callback muted on this thread (0: none).
pub(crate) fn muted() -> usize {
    MUTED.with(|m| m.get())
}

/// A wake-up callback's key: its address.
pub(crate) fn wake_key(wake: &WakeFn) -> usize {
    std::sync::Arc::as_ptr(wake) as *const () as usize
}
