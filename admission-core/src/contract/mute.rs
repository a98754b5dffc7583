//! Muting a wake-up callback on this thread: how a monitor's hand-off keeps the accounts it gives
//! back to from waking its own evaluator.
//!
//! A thread that gives a grant back runs that monitor's pass right after (`Owner::settle` in `monitor/shell.rs`),
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

/// The callback of one key muted on this thread while this guard lives; the key muted before is
/// muted again when it is dropped, even while a panic unwinds.
#[must_use = "the callback is muted only while the guard lives"]
pub(crate) struct Muted(usize);

impl Muted {
    /// Mutes the callback of key `key` on this thread.
    #[inline]
    pub(crate) fn on(key: usize) -> Muted {
        Muted(MUTED.with(|m| m.replace(key)))
    }
}

impl Drop for Muted {
    #[inline]
    fn drop(&mut self) {
        let previous = self.0;
        MUTED.with(|m| m.set(previous));
    }
}

/// The key of the callback muted on this thread (0: none).
pub(crate) fn muted() -> usize {
    MUTED.with(|m| m.get())
}

/// A wake-up callback's key: its address.
pub(crate) fn wake_key(wake: &WakeFn) -> usize {
    std::sync::Arc::as_ptr(wake) as *const () as usize
}
