//! Tenants sharing one scarce model, simulated on a fake clock: what issue 39's goal rows measure
//! (the share each tenant is served, how long an interactive job or a big head waits), run
//! against the monitor as it is, so that the rows have today's values before fair shares exist.
//!
//! A simulation is one [`Monitor`] with manual passes on a [`FakeClock`] and one model, a
//! [`TokenBucket`] of [`TOKENS_PER_MINUTE`]; each job asks it for its tokens and one request. The
//! loop is event-driven, never polling: run a pass, collect every admit it decided, release the
//! grants at once (a model's tokens come back with time, not on release), submit what the
//! scenario submits next, then move the clock to the instant the pass said something could
//! change (a refill the head needs, the next arrival), never past the end. Everything is
//! deterministic: the same scenario gives the same figures on any machine.

use std::sync::Arc;
use std::time::Duration;

use admission_accounts::token_bucket::{TokenBucket, TokenBucketConfig};
use admission_core::{
    Admit, Amount, Demand, FairShares, Instant, JobContext, Level, Levels, Monitor,
};
use admission_testkit::FakeClock;
use admission_testkit::monitor::poll_once;

/// The model's budget: tokens per minute (and its refill rate).
pub const TOKENS_PER_MINUTE: u64 = 60_000;

/// The model's request budget: never the scarce one here.
const REQUESTS_PER_MINUTE: u64 = 100_000;

/// One minute.
pub const MINUTE: Duration = Duration::from_secs(60);

/// A job granted: whose, how many tokens, when it was submitted and when it was granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Served {
    /// The tenant's index.
    pub tenant: usize,
    /// The job's class's index (a scenario's own: batch or interactive, small or big).
    pub class: usize,
    /// Tokens the job asked for.
    pub tokens: u64,
    /// When it was submitted.
    pub submitted: Instant,
    /// When it was granted.
    pub granted: Instant,
}

impl Served {
    /// How long it waited.
    pub fn waited(&self) -> Duration {
        self.granted.saturating_duration_since(self.submitted)
    }
}

/// A job submitted and not decided yet.
struct Pending {
    served: Served,
    admit: Admit,
}

/// One simulation: the monitor, its clock and model, the jobs in flight and those served.
pub struct Sim {
    clock: FakeClock,
    monitor: Monitor,
    model: Arc<TokenBucket>,
    pending: Vec<Pending>,
    served: Vec<Served>,
    tenants: Vec<JobContext>,
}

impl Sim {
    /// A simulation of `tenants` tenants (named `tenant-0`, ...) on a full model at instant zero,
    /// its line in arrival order (`weights` `None`) or in fair shares of those weights (one per
    /// tenant, by index).
    pub fn new(tenants: usize, weights: Option<&[u32]>) -> Sim {
        Sim::with_levels(tenants, weights, None)
    }

    /// [`Sim::new`] with priority levels: `levels` and each tenant's level, by index.
    pub fn with_levels(
        tenants: usize,
        weights: Option<&[u32]>,
        levels: Option<(Levels, &[&str])>,
    ) -> Sim {
        let clock = FakeClock::new();
        let mut builder = Monitor::builder().manual_passes().clock(clock.shared());
        if let Some(weights) = weights {
            let shares = weights
                .iter()
                .enumerate()
                .try_fold(FairShares::new(), |shares, (t, &w)| {
                    shares.weight(format!("tenant-{t}"), w)
                })
                .expect("valid weights");
            builder = builder.fair_shares(shares);
        }
        if let Some((levels, _)) = &levels {
            builder = builder.levels(levels.clone());
        }
        let monitor = builder.build();
        let config = TokenBucketConfig::new(TOKENS_PER_MINUTE, REQUESTS_PER_MINUTE);
        let model = Arc::new(
            TokenBucket::new("model", config, monitor.clock().clone()).expect("a valid config"),
        );
        let tenants = (0..tenants)
            .map(|t| {
                let ctx = JobContext::new(format!("job-of-{t}")).with_tenant(format!("tenant-{t}"));
                match &levels {
                    Some((_, of)) => ctx.with_level(of[t]),
                    None => ctx,
                }
            })
            .collect();
        Sim {
            clock,
            monitor,
            model,
            pending: Vec::new(),
            served: Vec::new(),
            tenants,
        }
    }

    /// The simulated time.
    pub fn now(&self) -> Instant {
        self.monitor.clock().now()
    }

    /// Submits a job of `tenant` and `class` asking for `tokens`: it is granted at once if it
    /// fits behind the line, else it waits in it.
    pub fn submit(&mut self, tenant: usize, class: usize, tokens: u64) {
        let demand = Demand::new().with(self.model.clone(), Amount::pair(tokens, 1));
        let served = Served {
            tenant,
            class,
            tokens,
            submitted: self.now(),
            granted: Instant::MAX,
        };
        let mut admit = self.monitor.admit(demand, &self.tenants[tenant], None);
        match poll_once(&mut admit) {
            None => self.pending.push(Pending { served, admit }),
            Some(outcome) => self.record(served, outcome.is_ok()),
        }
    }

    fn record(&mut self, mut served: Served, granted: bool) {
        assert!(granted, "job of tenant {} refused", served.tenant);
        served.granted = self.now();
        self.served.push(served);
    }

    /// Jobs waiting, of `tenant`.
    pub fn waiting(&self, tenant: usize) -> usize {
        self.pending
            .iter()
            .filter(|p| p.served.tenant == tenant)
            .count()
    }

    /// Runs one pass and collects what it decided; returns the jobs granted, in the order the
    /// line holds them, and the instant the pass asked to be woken at.
    pub fn step(&mut self) -> (Vec<Served>, Option<Instant>) {
        let wake = self.monitor.pass_now();
        let mut granted = Vec::new();
        let mut still = Vec::with_capacity(self.pending.len());
        for mut p in std::mem::take(&mut self.pending) {
            match poll_once(&mut p.admit) {
                None => still.push(p),
                Some(outcome) => {
                    let before = self.served.len();
                    self.record(p.served, outcome.is_ok());
                    granted.push(self.served[before]);
                }
            }
        }
        self.pending = still;
        (granted, wake)
    }

    /// Moves the clock to `wake` (or by `idle` when nothing is due), never past `end`; false
    /// once the clock stands at `end`.
    pub fn advance(&mut self, wake: Option<Instant>, idle: Duration, end: Instant) -> bool {
        let now = self.now();
        if now >= end {
            return false;
        }
        let to = match wake {
            Some(at) if at > now => at,
            _ => now.saturating_add(idle),
        };
        self.clock.advance_to(to.min(end));
        true
    }

    /// Everything served so far, in the order granted.
    pub fn served(&self) -> &[Served] {
        &self.served
    }
}

/// Jain's fairness index of `x` (1 when every value is equal, 1/n when one has everything).
pub fn jain(x: &[f64]) -> f64 {
    let sum: f64 = x.iter().sum();
    let squares: f64 = x.iter().map(|v| v * v).sum();
    if squares == 0.0 {
        return 1.0;
    }
    sum * sum / (x.len() as f64 * squares)
}

/// Tokens served to each of `tenants` tenants in each whole minute `[from, to)` (minutes counted
/// from instant zero, by the instant of the grant).
pub fn tokens_per_minute(served: &[Served], tenants: usize, from: u64, to: u64) -> Vec<Vec<f64>> {
    let mut minutes = vec![vec![0.0; tenants]; (to - from) as usize];
    for s in served {
        let minute = s.granted.as_nanos() / MINUTE.as_nanos() as u64;
        if (from..to).contains(&minute) {
            minutes[(minute - from) as usize][s.tenant] += s.tokens as f64;
        }
    }
    minutes
}

/// Two backlogged tenants: each keeps `backlog[t]` jobs of `tokens` waiting, submitting a new
/// one for each granted, for `minutes` minutes, in arrival order or in fair shares of
/// `weights`. Returns what was served.
pub fn backlogged(
    backlog: [usize; 2],
    tokens: u64,
    minutes: u32,
    weights: Option<&[u32]>,
) -> Vec<Served> {
    let mut sim = Sim::new(2, weights);
    let end = Instant::ZERO.saturating_add(MINUTE * minutes);
    loop {
        for (tenant, &want) in backlog.iter().enumerate() {
            while sim.waiting(tenant) < want {
                sim.submit(tenant, 0, tokens);
            }
        }
        let (_, wake) = sim.step();
        let refilled = backlog
            .iter()
            .enumerate()
            .all(|(t, &want)| sim.waiting(t) >= want);
        if refilled && !sim.advance(wake, Duration::from_millis(1), end) {
            break;
        }
    }
    sim.served().to_vec()
}

/// The priority levels of [`interactive_waits`] with levels: `interactive` reserving
/// `reserve` tokens of the model, above `batch`.
pub fn interactive_levels(reserve: u64) -> Levels {
    Levels::new()
        .level(Level::new("interactive").reserve("model", Amount::pair(reserve, 0)))
        .and_then(|levels| levels.level(Level::new("batch")))
        .expect("valid levels")
}

/// An interactive tenant (1) submits a job of `interactive_tokens` every `every` for the first
/// `submitting` minutes, while a batch tenant (0) keeps `flood` jobs of `batch_tokens` waiting
/// (0: no flood), for `minutes` minutes in all. With `reserve`, the interactive tenant's jobs
/// are of the level `interactive`, which reserves that many tokens of the model, and the batch
/// tenant's of `batch` ([`interactive_levels`]). Returns each interactive job's wait; one still
/// waiting at the end counts its wait up to the end.
pub fn interactive_waits(
    flood: usize,
    batch_tokens: u64,
    (interactive_tokens, every): (u64, Duration),
    submitting: u32,
    minutes: u32,
    weights: Option<&[u32]>,
    reserve: Option<u64>,
) -> Vec<Duration> {
    let levels = reserve.map(|r| (interactive_levels(r), &["batch", "interactive"][..]));
    let mut sim = Sim::with_levels(2, weights, levels);
    let end = Instant::ZERO.saturating_add(MINUTE * minutes);
    let last = Instant::ZERO.saturating_add(MINUTE * submitting);
    let mut next_interactive = Instant::ZERO;
    loop {
        while sim.waiting(0) < flood {
            sim.submit(0, 0, batch_tokens);
        }
        if sim.now() >= next_interactive && sim.now() < last {
            sim.submit(1, 1, interactive_tokens);
            next_interactive = next_interactive.saturating_add(every);
        }
        let (_, wake) = sim.step();
        if sim.waiting(0) < flood {
            continue;
        }
        let wake = match (wake, next_interactive < last) {
            (Some(w), true) => Some(w.min(next_interactive)),
            (None, true) => Some(next_interactive),
            (wake, false) => wake,
        };
        if !sim.advance(wake, Duration::from_millis(1), end) {
            break;
        }
    }
    let now = sim.now();
    let mut waits: Vec<Duration> = sim
        .served()
        .iter()
        .filter(|s| s.class == 1)
        .map(Served::waited)
        .collect();
    waits.extend(
        sim.pending
            .iter()
            .filter(|p| p.served.class == 1)
            .map(|p| now.saturating_duration_since(p.served.submitted)),
    );
    waits
}

/// The priority levels of [`lower_level_share`]: `interactive` above `batch`, which reserves
/// `reserve` tokens of the model, and the same share of its requests (a level dips only into
/// the dimensions it reserves).
pub fn batch_reserving(reserve: u64) -> Levels {
    Levels::new()
        .level(Level::new("interactive"))
        .and_then(|levels| {
            let requests = reserve * REQUESTS_PER_MINUTE / TOKENS_PER_MINUTE;
            levels.level(Level::new("batch").reserve("model", Amount::pair(reserve, requests)))
        })
        .expect("valid levels")
}

/// An interactive tenant (0) keeps `backlog` jobs of `tokens.0` waiting, and a batch tenant (1),
/// of the level below ([`batch_reserving`]), `backlog` jobs of `tokens.1`, for `minutes`
/// minutes. Returns what was served.
pub fn lower_level_share(
    reserve: u64,
    tokens: (u64, u64),
    backlog: usize,
    minutes: u32,
) -> Vec<Served> {
    let levels = (batch_reserving(reserve), &["interactive", "batch"][..]);
    let mut sim = Sim::with_levels(2, None, Some(levels));
    let end = Instant::ZERO.saturating_add(MINUTE * minutes);
    loop {
        for (tenant, tokens) in [(0, tokens.0), (1, tokens.1)] {
            while sim.waiting(tenant) < backlog {
                sim.submit(tenant, tenant, tokens);
            }
        }
        let (_, wake) = sim.step();
        if (0..2).all(|t| sim.waiting(t) >= backlog)
            && !sim.advance(wake, Duration::from_millis(1), end)
        {
            break;
        }
    }
    sim.served().to_vec()
}

/// A big demand of `big` tokens arrives on an empty model (its budget just spent by tenant 0),
/// with `backfillers` small jobs of `small` tokens of other tenants (1 to 10) behind it. Returns
/// how long the big one waited and how many small ones were granted before it.
pub fn big_head(
    big: u64,
    small: u64,
    backfillers: usize,
    weights: Option<&[u32]>,
) -> (Duration, usize) {
    let mut sim = Sim::new(11, weights);
    // Spend the budget: the bucket starts full.
    for _ in 0..TOKENS_PER_MINUTE / small {
        sim.submit(0, 0, small);
    }
    assert_eq!(
        sim.waiting(0),
        0,
        "the first minute's budget is granted at once"
    );
    sim.submit(0, 1, big);
    for i in 0..backfillers {
        sim.submit(1 + i % 10, 0, small);
    }
    let end = Instant::ZERO.saturating_add(MINUTE * 60);
    loop {
        let (_, wake) = sim.step();
        if sim.served().iter().any(|s| s.class == 1) {
            break;
        }
        assert!(
            sim.advance(wake, Duration::from_millis(1), end),
            "the big head was not granted within an hour"
        );
    }
    let served = sim.served();
    let at = served
        .iter()
        .position(|s| s.class == 1)
        .expect("granted above");
    let before = served[..at].iter().filter(|s| s.tenant != 0).count();
    (served[at].waited(), before)
}

/// The `q` quantile (0 to 1) of `values`, nearest rank.
pub fn quantile(values: &[Duration], q: f64) -> Duration {
    let mut sorted = values.to_vec();
    sorted.sort();
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_is_one_for_equal_shares_and_one_over_n_for_one_taking_all() {
        assert_eq!(jain(&[5.0, 5.0]), 1.0);
        assert_eq!(jain(&[7.0, 0.0]), 0.5);
        // 10:1 is the arrival order's share when one tenant keeps ten times the other's backlog.
        assert_eq!(jain(&[10.0, 1.0]), 121.0 / 202.0);
    }

    /// Arrival order serves two backlogged tenants in the ratio of their backlogs: 100 jobs of
    /// one against 10 of the other is 10:1 over the line's cycle (110 jobs, 110 s), a Jain index
    /// of 121/202 = 0.599; a single minute sees part of a cycle, between 5:1 and all to one.
    #[test]
    fn arrival_order_serves_backlogs_in_their_ratio() {
        let served = backlogged([100, 10], 1_000, 12, None);
        let minutes = tokens_per_minute(&served, 2, 1, 12);
        for (m, shares) in minutes.iter().enumerate() {
            assert_eq!(
                shares.iter().sum::<f64>(),
                TOKENS_PER_MINUTE as f64,
                "minute {}: the model's whole budget, no more",
                m + 1
            );
        }
        let totals: Vec<f64> = (0..2).map(|t| minutes.iter().map(|m| m[t]).sum()).collect();
        let j = jain(&totals);
        assert!((j - 121.0 / 202.0).abs() < 0.01, "{totals:?} {j}");
    }

    /// A head of ten times the others' size waits exactly as long as its tokens take to come
    /// back, and nobody behind it takes them meanwhile (the head's reservation).
    #[test]
    fn a_big_head_waits_for_its_own_refill_and_no_longer() {
        let (waited, before) = big_head(10_000, 1_000, 1_000, None);
        assert_eq!(
            waited,
            Duration::from_secs(10),
            "10,000 tokens at 1,000 a second"
        );
        assert_eq!(before, 0, "no backfiller took the head's tokens");
    }

    /// Without a flood an interactive job never waits; behind a flood of 100 batch jobs of
    /// 1,000 tokens (100 s of the model's budget) every one waits for the whole flood ahead of
    /// it, at least 100 s, and the first exactly that plus its own 500 tokens' half second.
    #[test]
    fn an_interactive_job_waits_behind_the_whole_flood_in_arrival_order() {
        let job = (500, Duration::from_secs(2));
        let alone = interactive_waits(0, 1_000, job, 3, 3, None, None);
        assert_eq!(alone.len(), 90, "one every 2 s for 3 minutes");
        assert_eq!(alone.iter().max(), Some(&Duration::ZERO));
        let flooded = interactive_waits(100, 1_000, job, 3, 9, None, None);
        assert_eq!(flooded.len(), 90);
        assert_eq!(flooded[0], Duration::from_millis(100_500));
        assert!(
            flooded.iter().all(|w| *w >= Duration::from_secs(100)),
            "{flooded:?}"
        );
    }

    /// Fair shares of weights 1:1 serve two backlogged tenants equally whatever their backlogs:
    /// every minute's Jain index at least 0.98 (arrival order: 0.5 to 0.69).
    #[test]
    fn fair_shares_serve_backlogged_tenants_equally_every_minute() {
        let served = backlogged([100, 10], 1_000, 12, Some(&[1, 1]));
        for (m, shares) in tokens_per_minute(&served, 2, 1, 12).iter().enumerate() {
            assert_eq!(shares.iter().sum::<f64>(), TOKENS_PER_MINUTE as f64);
            assert!(jain(shares) >= 0.98, "minute {}: {shares:?}", m + 1);
        }
    }

    /// Weights 3:1 give the heavier tenant three quarters of every minute, 0.75 +/- 0.03.
    #[test]
    fn fair_shares_follow_the_weights_every_minute() {
        let served = backlogged([50, 50], 1_000, 12, Some(&[3, 1]));
        for (m, shares) in tokens_per_minute(&served, 2, 1, 12).iter().enumerate() {
            let share = shares[0] / (shares[0] + shares[1]);
            assert!((share - 0.75).abs() <= 0.03, "minute {}: {shares:?}", m + 1);
        }
    }

    /// At a level of its own that reserves 1,000 tokens of the model (two of its jobs), an
    /// interactive job behind a flood of 100 batch jobs never waits: the batch level leaves the
    /// reserve in the bucket, and a newcomer of a higher level stands before the batch head.
    #[test]
    fn an_interactive_level_with_a_reserve_never_waits_behind_the_flood() {
        let job = (500, Duration::from_secs(2));
        let flooded = interactive_waits(100, 1_000, job, 3, 9, None, Some(1_000));
        assert_eq!(flooded.len(), 90);
        assert_eq!(flooded.iter().max(), Some(&Duration::ZERO), "{flooded:?}");
        // Without the reserve, the level alone puts it first in line, but the flood keeps the
        // bucket empty: it waits for its own 500 tokens' refill, half a second.
        let first_only = interactive_waits(100, 1_000, job, 3, 9, None, Some(0));
        assert_eq!(first_only.iter().max(), Some(&Duration::from_millis(500)));
    }
}
