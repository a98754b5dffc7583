//! The fixed window as an [`Account`]: what a monitor asks when the window sits in a demand.
//!
//! The account counts the primary dimension of an amount against the same window and count as
//! the standalone limiter, and replenishes with time. It reports nothing to the limiter's
//! listener: inside a demand, the monitor emits the events.

use admission_core::{
    Account, AccountStatus, Amount, Answer, Ask, Category, Refusal, Replenishment, WakeFn,
};

use super::FixedWindow;

impl FixedWindow {
    /// The primary dimension of `mine`, or the refusal of an amount no window can hold.
    fn permits_of(&self, mine: Amount) -> Result<u64, Refusal> {
        let n = mine.primary();
        let config = &self.config;
        if n > config.limit {
            return Err(
                Refusal::too_large(mine, Amount::units(config.limit)).with_message(format!(
                    "fixed window `{}` allows {} calls per {:?} window, so a demand of {n} can \
                     never fit; ask for at most {} at a time",
                    config.name, config.limit, config.period, config.limit
                )),
            );
        }
        Ok(n)
    }
}

impl Account for FixedWindow {
    fn name(&self) -> &str {
        self.config.name
    }

    fn category(&self) -> Category {
        FixedWindow::CATEGORY
    }

    fn replenishment(&self) -> Replenishment {
        Replenishment::Time
    }

    /// The window's limit.
    fn capacity(&self) -> Option<Amount> {
        Some(Amount::units(self.config.limit))
    }

    /// One compare-and-swap (one read for a look): `mine` permits are taken when they fit the
    /// current window beside the head's reservation. "Not now" names the start of the next
    /// window, when a fresh window holds `mine` with the reservation, and `None` when no window
    /// ever can (or the next one is past the end of the clock). An amount above the limit is
    /// refused for good ([`RefusalKind::TooLarge`](admission_core::RefusalKind::TooLarge)).
    fn ask(&self, mine: Amount, ask: Ask) -> Answer {
        let n = match self.permits_of(mine) {
            Ok(n) => n,
            Err(refusal) => return Answer::Never(refusal),
        };
        let reserved = ask.reserved_ahead().primary();
        let limit = self.config.limit;
        let now = ask.now(&*self.config.clock);
        let fits = if ask.takes() {
            self.word.take(now, n, reserved, limit)
        } else {
            let view = self.word.read(now);
            if n.saturating_add(reserved) <= limit.saturating_sub(view.used) {
                Ok(view)
            } else {
                Err(view)
            }
        };
        match fits {
            Ok(_) => Answer::Taken,
            Err(_) if n.saturating_add(reserved) > limit => Answer::NotNow(None),
            Err(view) => Answer::NotNow(self.word.next_start(view)),
        }
    }

    /// Returns permits to the current window, never below zero used, and wakes the monitor.
    ///
    /// A give cannot tell which window its permits were taken in: it credits the window stored
    /// now if that window is still open, and credits nothing once it has ended (the window that
    /// follows starts empty anyway). The monitor rolls a take back within the same pass, so in
    /// practice the window has not turned in between.
    fn give(&self, amount: Amount) {
        let credited = self.word.give(self.config.clock.now(), amount.primary());
        if credited > 0 {
            self.wake.notify();
        }
    }

    fn status(&self) -> Box<dyn AccountStatus> {
        Box::new(self.snapshot())
    }

    fn on_capacity_change(&self, wake: Option<WakeFn>) {
        self.wake.install(wake);
    }

    fn forget_capacity_change(&self, wake: &WakeFn) {
        self.wake.clear_if(wake);
    }
}
