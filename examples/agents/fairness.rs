//! `--tenants`, `--interactive-percent` and `--fairness`: tenants of different sizes and weights
//! and an interactive priority level on the one monitor, and what the report, the timeline and
//! `--check` make of them.
//!
//! - **Tenants** (`--tenants acme:3:300,globex:1:100`): each runs its number of agents (the plan
//!   is drawn from the seed as for `--jobs`, the first 300 agents acme's, the next 100 globex's),
//!   and every step's context names its tenant ([`JobContext::with_tenant`]). Under `--fairness
//!   on` the monitor shares its line between them by weight ([`FairShares`]).
//! - **Levels** (`--interactive-percent P`): P agents in a hundred, spread evenly through the
//!   plan, run every step at the `interactive` level, the rest at `batch`. Under `--fairness on`
//!   the monitor has the two levels ([`Levels`]): an interactive newcomer stands before every
//!   batch waiter, and the interactive level reserves a few steps' worth of what its steps ask
//!   ([`reserves`]): [`INTERACTIVE_RESERVE_TOKENS`] of each model's token bucket, two calls of
//!   each window, a slot of each model's concurrency gate, two HTTP connections and a database
//!   connection. Batch steps always leave the tokens and window calls aside (burst, never rate);
//!   the connections and slots only while an interactive step is parked.
//! - **`--fairness off`** is the same plan and contexts on a monitor with neither (arrival order);
//!   `--fairness both` runs the seed once each way and prints them side by side.
//!
//! The report is computed from the example's own per-grant records ([`StepRecord`]: tenant,
//! level, model, tokens, when granted, how long it waited). A tenant is owed its weight's share
//! only while it is backlogged, so shares are judged per simulated minute among the tenants that
//! had a step waiting for the model (at the judged level) through the whole minute, in the
//! minutes when two or more did ("contested" minutes).

use std::fmt::Write as _;
use std::str::FromStr;

use admission_core::{Amount, FairShares, JobContext, Level, Levels};
use admission_llm::model_spec::ModelCatalog;
use anyhow::Context as _;
use serde::Serialize;

use crate::report::{WaitRow, span};
use crate::stats::{StepRecord, histogram};
use crate::timeline::{SharePanel, TenantShares};
use crate::workload::{JobPlan, LARGEST_STEP_TOKENS};
use crate::world::{DB, HTTP, SEARCH};

/// The level of the agents `--interactive-percent` picks.
pub const INTERACTIVE: &str = "interactive";
/// The level of every other agent (the default level: the last declared).
pub const BATCH: &str = "batch";
/// The model `--check` judges the tenants' shares of: the fleet's bottleneck (`models.toml`).
pub const SCARCE_MODEL: &str = "model-a";
/// Tokens of each model's bucket the interactive level reserves: three of the largest steps.
pub const INTERACTIVE_RESERVE_TOKENS: u64 = 3 * LARGEST_STEP_TOKENS;
/// How far a backlogged tenant's share of the scarce model's tokens may be from its weight's
/// share, absolute, before `--check` fails the run.
pub const SHARE_TOLERANCE: f64 = 0.05;
/// The fewest contested minutes a tenant's share is judged over: fewer say too little.
pub const MIN_CONTESTED_MINUTES: u64 = 3;
/// The longest p99 wait, in simulated seconds, `--check` accepts of the interactive level under
/// fair shares while the batch level floods the line: a stated bound, not a second run without
/// the flood. An interactive step stands before every batch waiter and finds its level's
/// reserve; beyond the reserve it waits for the next refill of what it lacks, which on the
/// slowest account a step asks (the search API's fixed window) comes within a minute. Stuck
/// behind the flood in arrival order it waits minutes (4 to 5 at seed 42).
pub const INTERACTIVE_P99_BOUND_S: f64 = 60.0;
/// The window shares are counted in: a simulated minute.
const MINUTE_S: f64 = 60.0;
/// The most tenants `--tenants` takes (one colour each in the timeline).
const MAX_TENANTS: usize = 10;
/// The most agents all tenants run together (as `--jobs`).
const MAX_AGENTS: u64 = 100_000;

/// One tenant of `--tenants`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TenantSpec {
    /// Its name, as contexts, events and metrics carry it.
    pub name: String,
    /// Its weight in fair shares.
    pub weight: u32,
    /// How many agents it runs.
    pub agents: u32,
}

/// `--tenants NAME:WEIGHT:AGENTS[,NAME:WEIGHT:AGENTS...]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantList(pub Vec<TenantSpec>);

impl FromStr for TenantList {
    type Err = String;

    fn from_str(text: &str) -> Result<TenantList, String> {
        let mut tenants: Vec<TenantSpec> = Vec::new();
        for part in text.split(',') {
            let fields: Vec<&str> = part.trim().split(':').collect();
            let [name, weight, agents] = fields.as_slice() else {
                return Err(format!("`{part}` is not NAME:WEIGHT:AGENTS"));
            };
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                return Err(format!(
                    "the tenant name `{name}` must be letters, digits, `-` or `_`"
                ));
            }
            if *name == "other" {
                return Err("`other` is the metrics' label of every tenant not named".into());
            }
            if tenants.iter().any(|t| t.name == *name) {
                return Err(format!("the tenant `{name}` is named twice"));
            }
            let weight: u32 = weight
                .parse()
                .ok()
                .filter(|w| (1..=FairShares::MAX_WEIGHT).contains(w))
                .ok_or_else(|| {
                    format!(
                        "the weight of `{name}` must be 1 to {}, was `{weight}`",
                        FairShares::MAX_WEIGHT
                    )
                })?;
            let agents: u32 = agents
                .parse()
                .ok()
                .filter(|&a| a >= 1)
                .ok_or_else(|| format!("`{name}` must run 1 or more agents, was `{agents}`"))?;
            tenants.push(TenantSpec {
                name: (*name).to_owned(),
                weight,
                agents,
            });
        }
        if tenants.len() > MAX_TENANTS {
            return Err(format!("at most {MAX_TENANTS} tenants"));
        }
        let total: u64 = tenants.iter().map(|t| u64::from(t.agents)).sum();
        if total > MAX_AGENTS {
            return Err(format!(
                "the tenants run {total} agents together, at most {MAX_AGENTS}"
            ));
        }
        Ok(TenantList(tenants))
    }
}

/// `--fairness`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FairnessArg {
    /// The monitor keeps fair shares between the tenants and the priority levels.
    On,
    /// Arrival order: no fair shares, no levels (the same contexts).
    Off,
    /// Both runs of the same seed, side by side.
    Both,
}

/// Whether one run's monitor keeps fair shares and levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Fair shares and levels.
    On,
    /// Arrival order.
    Off,
}

impl Mode {
    /// `on` or `off`.
    pub fn name(self) -> &'static str {
        match self {
            Mode::On => "on",
            Mode::Off => "off",
        }
    }
}

/// The tenants and levels of an invocation, and the monitor configuration they make.
#[derive(Clone, Debug)]
pub struct Config {
    /// The tenants (empty: none, every agent without a tenant).
    pub tenants: Vec<TenantSpec>,
    /// Agents in a hundred at the interactive level (0: no levels).
    pub interactive_percent: u8,
    /// The weights, with tenants.
    pub shares: Option<FairShares>,
    /// The levels, with interactive agents.
    pub levels: Option<Levels>,
}

impl Config {
    /// The configuration of `tenants` and `interactive_percent` agents in a hundred interactive,
    /// the interactive level reserving `reserves` (by account name); `None` when neither is
    /// asked for.
    ///
    /// # Errors
    ///
    /// When the monitor refuses a weight or a level (never, for parsed tenants).
    pub fn new(
        tenants: Vec<TenantSpec>,
        interactive_percent: u8,
        reserves: &[(String, Amount)],
    ) -> anyhow::Result<Option<Config>> {
        if tenants.is_empty() && interactive_percent == 0 {
            return Ok(None);
        }
        let shares = if tenants.is_empty() {
            None
        } else {
            // The tenants contend for the scarce model: a step's cost is its tokens of it, so a
            // tenant's steps on the other models do not count against its share of this one.
            let mut shares = FairShares::new().scarce(SCARCE_MODEL);
            for t in &tenants {
                shares = shares
                    .weight(t.name.as_str(), t.weight)
                    .context("the tenants' weights")?;
            }
            Some(shares)
        };
        let levels = if interactive_percent == 0 {
            None
        } else {
            let interactive = reserves
                .iter()
                .fold(Level::new(INTERACTIVE), |level, (account, amount)| {
                    level.reserve(account.as_str(), *amount)
                });
            Some(
                Levels::new()
                    .level(interactive)
                    .and_then(|l| l.level(Level::new(BATCH)))
                    .context("the priority levels")?,
            )
        };
        Ok(Some(Config {
            tenants,
            interactive_percent,
            shares,
            levels,
        }))
    }

    /// The context of `job`'s steps: its tenant and its level, when there are any.
    pub fn context(&self, ctx: JobContext, job: &JobPlan) -> JobContext {
        let ctx = match job.tenant.and_then(|t| self.tenants.get(t)) {
            Some(tenant) => ctx.with_tenant(tenant.name.as_str()),
            None => ctx,
        };
        if self.levels.is_some() {
            ctx.with_level(if job.interactive { INTERACTIVE } else { BATCH })
        } else {
            ctx
        }
    }

    /// The level the tenants' shares are judged at: batch, when there are levels (fair shares
    /// are kept within each level, and batch is the one that floods).
    fn judged_level(&self) -> Option<bool> {
        self.levels.is_some().then_some(false)
    }

    /// One line saying what the monitor of a run in `mode` keeps.
    fn describe(&self, mode: Option<Mode>) -> String {
        let Some(mode) = mode else {
            return "hold-and-wait (no line: no fair shares, no levels)".to_owned();
        };
        if mode == Mode::Off {
            return "fairness off (arrival order: no fair shares, no levels; the same contexts)"
                .to_owned();
        }
        let mut parts = Vec::new();
        if !self.tenants.is_empty() {
            let weights: Vec<String> = self
                .tenants
                .iter()
                .map(|t| format!("{} {}", t.name, t.weight))
                .collect();
            parts.push(format!("fair shares by weight ({})", weights.join(", ")));
        }
        if self.levels.is_some() {
            parts.push(format!(
                "levels {INTERACTIVE} ({} % of agents) > {BATCH}, {INTERACTIVE} reserving {INTERACTIVE_RESERVE_TOKENS} tokens of each model's bucket, 2 calls of each window, a model slot, 2 HTTP and 1 database connections",
                self.interactive_percent
            ));
        }
        format!("fairness on: {}", parts.join("; "))
    }
}

/// What the interactive level reserves, by account name as the accounts name themselves: of
/// each model of `catalog`, its token bucket (named by the model's id in the provider layer's
/// `Registry`) [`INTERACTIVE_RESERVE_TOKENS`] (no requests), its concurrency gate
/// (`<id>:concurrency`) one slot, its window (`<id>:window`) two calls; two calls of the search
/// API's window, two HTTP connections, one database connection.
pub fn reserves(catalog: &ModelCatalog) -> Vec<(String, Amount)> {
    let mut reserves = Vec::new();
    for spec in &catalog.models {
        reserves.push((spec.id.clone(), Amount::pair(INTERACTIVE_RESERVE_TOKENS, 0)));
        if spec.max_concurrent.is_some() {
            reserves.push((format!("{}:concurrency", spec.id), Amount::ONE));
        }
        if spec.window.is_some() {
            reserves.push((format!("{}:window", spec.id), Amount::units(2)));
        }
    }
    reserves.push((SEARCH.to_owned(), Amount::units(2)));
    reserves.push((HTTP.to_owned(), Amount::units(2)));
    reserves.push((DB.to_owned(), Amount::ONE));
    reserves
}

/// One tenant's use of one model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ShareRow {
    /// The model.
    pub model: String,
    /// The tenant.
    pub tenant: String,
    /// Its weight.
    pub weight: u32,
    /// Tokens granted to it on the model over the run (prompt + declared most output; every
    /// level).
    pub tokens: u64,
    /// Its share of all the tokens granted on the model.
    pub share_of_all: f64,
    /// Simulated minutes it was backlogged on the model (at the judged level) beside at least
    /// one other backlogged tenant.
    pub contested_minutes: u64,
    /// In those minutes, its share of the tokens granted (at the judged level) to the
    /// backlogged tenants.
    pub share: Option<f64>,
    /// Its weight's share among the backlogged tenants, weighted by the tokens of each minute.
    pub owed: Option<f64>,
}

/// One tenant's admissions.
#[derive(Clone, Debug, Serialize)]
pub struct TenantRow {
    /// The tenant.
    pub tenant: String,
    /// Its weight.
    pub weight: u32,
    /// Its agents.
    pub agents: u32,
    /// Its waits over every model and level, in simulated seconds.
    pub waits: WaitRow,
}

/// What the tenants and levels got in one run.
#[derive(Clone, Debug, Serialize)]
pub struct FairnessReport {
    /// `on`, `off`, or `none` (hold-and-wait: no line).
    pub fairness: &'static str,
    /// What the run's monitor kept, in a line.
    pub configuration: String,
    /// The level shares are judged at (`all` without levels).
    pub judged_level: &'static str,
    /// Per tenant.
    pub tenants: Vec<TenantRow>,
    /// Per model and tenant.
    pub shares: Vec<ShareRow>,
    /// Per level (empty without levels), in simulated seconds.
    pub levels: Vec<WaitRow>,
    /// The scarce model's shares per simulated minute, for the timeline.
    #[serde(skip)]
    pub minutes: Vec<MinuteShares>,
}

/// One simulated minute of the scarce model, at the judged level.
#[derive(Clone, Debug, PartialEq)]
pub struct MinuteShares {
    /// The minute, from 0.
    pub minute: usize,
    /// Each tenant's share of the tokens granted in it (`None`: nothing granted).
    pub share: Vec<Option<f64>>,
    /// Each backlogged tenant's weight's share, when two or more were backlogged.
    pub owed: Vec<Option<f64>>,
}

/// The report of one run: `mode` is the monitor's (`None` for the hold-and-wait chain),
/// `records` every grant, `models` the catalog's ids, `end_s` the run's simulated length.
pub fn report(
    config: &Config,
    mode: Option<Mode>,
    records: &[StepRecord],
    models: &[String],
    end_s: f64,
) -> FairnessReport {
    let level = config.judged_level();
    let weights: Vec<u32> = config.tenants.iter().map(|t| t.weight).collect();
    let full_minutes = (end_s / MINUTE_S).floor().max(0.0) as usize;
    let mut shares = Vec::new();
    for model in models {
        let total: u64 = records
            .iter()
            .filter(|r| r.model == model)
            .map(|r| r.tokens)
            .sum();
        let contested = contested(records, model, level, &weights, full_minutes);
        for (t, tenant) in config.tenants.iter().enumerate() {
            let tokens: u64 = records
                .iter()
                .filter(|r| r.model == model && r.tenant == Some(t))
                .map(|r| r.tokens)
                .sum();
            let c = &contested[t];
            shares.push(ShareRow {
                model: model.clone(),
                tenant: tenant.name.clone(),
                weight: tenant.weight,
                tokens,
                share_of_all: ratio(tokens as f64, total as f64),
                contested_minutes: c.minutes,
                share: (c.base > 0).then(|| c.tokens as f64 / c.base as f64),
                owed: (c.base > 0).then(|| c.owed / c.base as f64),
            });
        }
    }
    let tenants = config
        .tenants
        .iter()
        .enumerate()
        .map(|(t, tenant)| TenantRow {
            tenant: tenant.name.clone(),
            weight: tenant.weight,
            agents: tenant.agents,
            waits: waits(&tenant.name, records.iter().filter(|r| r.tenant == Some(t))),
        })
        .collect();
    let levels = if config.levels.is_some() {
        [(INTERACTIVE, true), (BATCH, false)]
            .into_iter()
            .map(|(name, interactive)| {
                waits(
                    name,
                    records.iter().filter(|r| r.interactive == interactive),
                )
            })
            .collect()
    } else {
        Vec::new()
    };
    FairnessReport {
        fairness: mode.map_or("none", Mode::name),
        configuration: config.describe(mode),
        judged_level: match level {
            Some(true) => INTERACTIVE,
            Some(false) => BATCH,
            None => "all",
        },
        tenants,
        shares,
        levels,
        minutes: minute_shares(records, SCARCE_MODEL, level, &weights, end_s),
    }
}

/// `a / b`, 0 when `b` is 0.
fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

/// The waits of `records` as a row named `scope`.
fn waits<'r>(scope: &str, records: impl Iterator<Item = &'r StepRecord>) -> WaitRow {
    let mut h = histogram();
    for r in records {
        h.saturating_record((r.wait_s * 1e6).round() as u64);
    }
    let secs = |micros: u64| micros as f64 / 1e6;
    WaitRow {
        scope: scope.to_owned(),
        count: h.len(),
        p50_s: secs(h.value_at_quantile(0.5)),
        p99_s: secs(h.value_at_quantile(0.99)),
        max_s: secs(h.max()),
    }
}

/// One tenant's contested minutes on one model.
#[derive(Clone, Debug, Default, PartialEq)]
struct Contested {
    minutes: u64,
    /// Tokens granted to the tenant in them.
    tokens: u64,
    /// Tokens granted to every backlogged tenant in them.
    base: u64,
    /// The weight's share of each minute's base, summed.
    owed: f64,
}

/// Whether each tenant was backlogged on `model` (at `level`: `Some(interactive)`, or every
/// level) through each of the first `minutes` simulated minutes: a step of it waiting, granted
/// later, at every instant of the minute.
fn backlogged(
    records: &[StepRecord],
    model: &str,
    level: Option<bool>,
    tenants: usize,
    minutes: usize,
) -> Vec<Vec<bool>> {
    (0..tenants)
        .map(|t| {
            let mut waits: Vec<(f64, f64)> = records
                .iter()
                .filter(|r| {
                    r.model == model
                        && r.tenant == Some(t)
                        && level.is_none_or(|l| r.interactive == l)
                        && r.wait_s > 0.0
                })
                .map(|r| (r.granted_s - r.wait_s, r.granted_s))
                .collect();
            waits.sort_by(|a, b| a.0.total_cmp(&b.0));
            // Merged into disjoint spans.
            let mut spans: Vec<(f64, f64)> = Vec::new();
            for (from, to) in waits {
                match spans.last_mut() {
                    Some(last) if from <= last.1 => last.1 = last.1.max(to),
                    _ => spans.push((from, to)),
                }
            }
            (0..minutes)
                .map(|m| {
                    let (start, end) = (m as f64 * MINUTE_S, (m + 1) as f64 * MINUTE_S);
                    spans.iter().any(|&(from, to)| from <= start && to >= end)
                })
                .collect()
        })
        .collect()
}

/// Tokens granted on `model` at `level` per tenant per minute (of `minutes`).
fn granted(
    records: &[StepRecord],
    model: &str,
    level: Option<bool>,
    tenants: usize,
    minutes: usize,
) -> Vec<Vec<u64>> {
    let mut tokens = vec![vec![0; tenants]; minutes];
    for r in records {
        let minute = (r.granted_s / MINUTE_S).floor().max(0.0) as usize;
        if r.model == model
            && level.is_none_or(|l| r.interactive == l)
            && let (Some(t), Some(row)) = (r.tenant, tokens.get_mut(minute))
            && let Some(cell) = row.get_mut(t)
        {
            *cell += r.tokens;
        }
    }
    tokens
}

/// Each tenant's contested minutes on `model` at `level` over the first `minutes` minutes.
fn contested(
    records: &[StepRecord],
    model: &str,
    level: Option<bool>,
    weights: &[u32],
    minutes: usize,
) -> Vec<Contested> {
    let n = weights.len();
    let backlogged = backlogged(records, model, level, n, minutes);
    let granted = granted(records, model, level, n, minutes);
    let mut out = vec![Contested::default(); n];
    for (m, tokens) in granted.iter().enumerate() {
        let busy: Vec<usize> = (0..n).filter(|&t| backlogged[t][m]).collect();
        let base: u64 = busy.iter().map(|&t| tokens[t]).sum();
        if busy.len() < 2 || base == 0 {
            continue;
        }
        let weight: u64 = busy.iter().map(|&t| u64::from(weights[t])).sum();
        for &t in &busy {
            let c = &mut out[t];
            c.minutes += 1;
            c.tokens += tokens[t];
            c.base += base;
            c.owed += f64::from(weights[t]) / weight as f64 * base as f64;
        }
    }
    out
}

/// The scarce model's shares per minute (the last one partial), for the timeline.
fn minute_shares(
    records: &[StepRecord],
    model: &str,
    level: Option<bool>,
    weights: &[u32],
    end_s: f64,
) -> Vec<MinuteShares> {
    let n = weights.len();
    let minutes = (end_s / MINUTE_S).ceil().max(0.0) as usize;
    let full = (end_s / MINUTE_S).floor().max(0.0) as usize;
    let backlogged = backlogged(records, model, level, n, full);
    granted(records, model, level, n, minutes)
        .iter()
        .enumerate()
        .map(|(m, tokens)| {
            let total: u64 = tokens.iter().sum();
            let busy: Vec<usize> = (0..n)
                .filter(|&t| backlogged.get(t).and_then(|b| b.get(m)) == Some(&true))
                .collect();
            let weight: u32 = busy.iter().map(|&t| weights[t]).sum();
            MinuteShares {
                minute: m,
                share: tokens
                    .iter()
                    .map(|&x| (total > 0).then(|| x as f64 / total as f64))
                    .collect(),
                owed: (0..n)
                    .map(|t| {
                        (busy.len() >= 2 && busy.contains(&t))
                            .then(|| f64::from(weights[t]) / f64::from(weight))
                    })
                    .collect(),
            }
        })
        .collect()
}

/// What `--check` holds a run to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Goals {
    /// The most a share may be from its owed share, absolute.
    pub share_tolerance: f64,
    /// The fewest contested minutes a share is judged over.
    pub min_contested_minutes: u64,
    /// The longest interactive p99 wait, simulated seconds.
    pub interactive_p99_s: f64,
}

/// The goals `--check` uses.
pub const GOALS: Goals = Goals {
    share_tolerance: SHARE_TOLERANCE,
    min_contested_minutes: MIN_CONTESTED_MINUTES,
    interactive_p99_s: INTERACTIVE_P99_BOUND_S,
};

/// What `--check` finds wrong with a run's shares and levels: nothing unless its monitor kept
/// fair shares (`fairness` on); then each tenant whose share of [`SCARCE_MODEL`]'s tokens over
/// at least `min_contested_minutes` contested minutes is more than `share_tolerance` from its
/// weight's share, and an interactive level whose p99 wait passed `interactive_p99_s`.
pub fn judge(report: &FairnessReport, goals: &Goals) -> Vec<String> {
    let mut problems = Vec::new();
    if report.fairness != Mode::On.name() {
        return problems;
    }
    for row in report.shares.iter().filter(|r| r.model == SCARCE_MODEL) {
        let (Some(share), Some(owed)) = (row.share, row.owed) else {
            continue;
        };
        // A miss of exactly the tolerance passes, whatever the rounding of the difference.
        if row.contested_minutes >= goals.min_contested_minutes
            && (share - owed).abs() > goals.share_tolerance + 1e-9
        {
            problems.push(format!(
                "tenant {} got {:.3} of {}'s {} tokens while backlogged ({} contested minutes), its weight's share is {:.3} (tolerance ±{:.2})",
                row.tenant,
                share,
                row.model,
                report.judged_level,
                row.contested_minutes,
                owed,
                goals.share_tolerance
            ));
        }
    }
    if let Some(level) = report.levels.iter().find(|l| l.scope == INTERACTIVE)
        && level.count > 0
        && level.p99_s > goals.interactive_p99_s
    {
        problems.push(format!(
            "the {INTERACTIVE} level's p99 wait was {:.1} s over {} grants, above its bound of {:.1} s (simulated)",
            level.p99_s, level.count, goals.interactive_p99_s
        ));
    }
    problems
}

/// What [`judge`] looked at in a run that passed, in a line: the shares it judged (or that none
/// had enough contested minutes) and the interactive level's p99 against its bound.
pub fn judged(report: &FairnessReport, goals: &Goals) -> String {
    let judged: Vec<String> = report
        .shares
        .iter()
        .filter(|r| r.model == SCARCE_MODEL && r.contested_minutes >= goals.min_contested_minutes)
        .filter_map(|r| Some(format!("{} {:.3} of {:.3}", r.tenant, r.share?, r.owed?)))
        .collect();
    let shares = if judged.is_empty() {
        format!(
            "no tenant was backlogged on {SCARCE_MODEL} beside another for {} minutes: shares not judged",
            goals.min_contested_minutes
        )
    } else {
        format!(
            "shares of {SCARCE_MODEL}'s {} tokens within ±{:.2} of the weights' ({})",
            report.judged_level,
            goals.share_tolerance,
            judged.join(", ")
        )
    };
    match report.levels.iter().find(|l| l.scope == INTERACTIVE) {
        Some(level) if level.count > 0 => format!(
            "{shares}; {INTERACTIVE} p99 wait {:.1} s within {:.0} s",
            level.p99_s, goals.interactive_p99_s
        ),
        _ => shares,
    }
}

impl FairnessReport {
    /// The timeline's share panel: each tenant's share of [`SCARCE_MODEL`]'s tokens per minute.
    pub fn panel(&self) -> SharePanel {
        let middle = |m: &MinuteShares| m.minute as f64 + 0.5;
        SharePanel {
            title: format!("% of {SCARCE_MODEL}'s {} tokens", self.judged_level),
            tenants: self
                .tenants
                .iter()
                .enumerate()
                .map(|(t, tenant)| TenantShares {
                    label: format!("{} (weight {})", tenant.tenant, tenant.weight),
                    share: self
                        .minutes
                        .iter()
                        .filter_map(|m| Some((middle(m), (*m.share.get(t)?)?)))
                        .collect(),
                    owed: self
                        .minutes
                        .iter()
                        .filter_map(|m| Some((middle(m), (*m.owed.get(t)?)?)))
                        .collect(),
                })
                .collect(),
        }
    }

    /// The share row of `tenant` on `model`.
    pub fn share(&self, model: &str, tenant: &str) -> Option<&ShareRow> {
        self.shares
            .iter()
            .find(|r| r.model == model && r.tenant == tenant)
    }

    /// The wait row of `level`.
    pub fn level(&self, level: &str) -> Option<&WaitRow> {
        self.levels.iter().find(|l| l.scope == level)
    }

    /// The report as printed tables.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "tenants and levels: {}", self.configuration);
        if !self.tenants.is_empty() {
            let _ = writeln!(
                out,
                "{:<12} {:>6} {:>6} {:>7} {:>9} {:>9} {:>9}",
                "tenant", "weight", "agents", "grants", "wait p50", "wait p99", "wait max"
            );
            for t in &self.tenants {
                let _ = writeln!(
                    out,
                    "{:<12} {:>6} {:>6} {:>7} {:>9} {:>9} {:>9}",
                    t.tenant,
                    t.weight,
                    t.agents,
                    t.waits.count,
                    span(t.waits.p50_s),
                    span(t.waits.p99_s),
                    span(t.waits.max_s)
                );
            }
            let _ = writeln!(
                out,
                "shares: a tenant is owed its weight's share only among the backlogged tenants. \"share\" is a tenant's part of the {} level's tokens granted to backlogged tenants in the simulated minutes it and another tenant each had a step of that level waiting for the model through the whole minute (\"contested\"); \"owed\" its weight's part among them, averaged over those minutes by their tokens. --check judges {SCARCE_MODEL} under fairness on: |share - owed| <= {SHARE_TOLERANCE:.2} over {MIN_CONTESTED_MINUTES} or more contested minutes.",
                self.judged_level
            );
            let _ = writeln!(
                out,
                "{:<8} {:<12} {:>6} {:>10} {:>7} {:>10} {:>6} {:>6}",
                "model", "tenant", "weight", "tokens", "of all", "contested", "share", "owed"
            );
            for r in &self.shares {
                let opt = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"));
                let _ = writeln!(
                    out,
                    "{:<8} {:<12} {:>6} {:>10} {:>6.1}% {:>8} m {:>6} {:>6}",
                    r.model,
                    r.tenant,
                    r.weight,
                    r.tokens,
                    100.0 * r.share_of_all,
                    r.contested_minutes,
                    opt(r.share),
                    opt(r.owed)
                );
            }
        }
        if !self.levels.is_empty() {
            let _ = writeln!(
                out,
                "{:<12} {:>7} {:>9} {:>9} {:>9}   (--check under fairness on: {INTERACTIVE} p99 <= {INTERACTIVE_P99_BOUND_S:.0} s, a stated bound)",
                "level", "grants", "wait p50", "wait p99", "wait max"
            );
            for l in &self.levels {
                let _ = writeln!(
                    out,
                    "{:<12} {:>7} {:>9} {:>9} {:>9}",
                    l.scope,
                    l.count,
                    span(l.p50_s),
                    span(l.p99_s),
                    span(l.max_s)
                );
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_tenants(levels: bool) -> Config {
        let tenants = "acme:3:300,globex:1:100"
            .parse::<TenantList>()
            .expect("valid")
            .0;
        let catalog = ModelCatalog::from_toml(crate::CATALOG).expect("the catalog");
        Config::new(tenants, if levels { 10 } else { 0 }, &reserves(&catalog))
            .expect("a configuration")
            .expect("tenants asked for")
    }

    /// A grant of `tokens` on the scarce model to tenant `t` at `granted_s`, after `wait_s`.
    fn grant(t: usize, granted_s: f64, wait_s: f64, tokens: u64) -> StepRecord {
        StepRecord {
            tenant: Some(t),
            interactive: false,
            model: SCARCE_MODEL,
            granted_s,
            wait_s,
            tokens,
        }
    }

    #[test]
    fn tenants_parse_and_bad_lists_are_refused() {
        let list: TenantList = "acme:3:300, globex:1:100".parse().expect("valid");
        assert_eq!(
            list.0,
            vec![
                TenantSpec {
                    name: "acme".into(),
                    weight: 3,
                    agents: 300
                },
                TenantSpec {
                    name: "globex".into(),
                    weight: 1,
                    agents: 100
                },
            ]
        );
        for bad in [
            "",
            "acme",
            "acme:3",
            "acme:0:10",
            "acme:3:0",
            "acme:x:10",
            "acme:1:1,acme:1:1",
            "other:1:1",
            "a b:1:1",
            "acme:1:100001",
            "acme:1000001:1",
        ] {
            assert!(bad.parse::<TenantList>().is_err(), "{bad:?} was accepted");
        }
    }

    /// Two tenants, 3:1, both waiting through minutes 0 and 1, only acme through minute 2: the
    /// contested minutes are 0 and 1, and the shares are counted over them alone.
    #[test]
    fn shares_count_only_the_minutes_two_tenants_were_backlogged() {
        let records = vec![
            // acme waits from 0 to 185 s in three overlapping waits, granted in minutes 0, 1, 3.
            grant(0, 50.0, 50.0, 3_000),
            grant(0, 110.0, 70.0, 3_000),
            grant(0, 185.0, 85.0, 6_000),
            // globex waits from 0 to 125 s, granted in minutes 1 and 2.
            grant(1, 70.0, 70.0, 1_000),
            grant(1, 125.0, 60.0, 1_000),
        ];
        let report = report(
            &two_tenants(false),
            Some(Mode::On),
            &records,
            &[SCARCE_MODEL.to_owned()],
            200.0,
        );
        let acme = report.share(SCARCE_MODEL, "acme").expect("a row");
        // Minute 0: acme 3,000 of the 3,000 granted to the backlogged; minute 1: 3,000 of 4,000.
        // Minute 2 is acme's alone (globex stopped waiting at 125 s), minute 3 is not whole.
        assert_eq!(acme.contested_minutes, 2);
        assert_eq!(acme.share, Some(6_000.0 / 7_000.0));
        assert_eq!(acme.owed, Some(0.75));
        assert_eq!(acme.tokens, 12_000);
        assert_eq!(acme.share_of_all, 12_000.0 / 14_000.0);
        let globex = report.share(SCARCE_MODEL, "globex").expect("a row");
        assert_eq!(globex.contested_minutes, 2);
        assert_eq!(globex.share, Some(1_000.0 / 7_000.0));
        assert_eq!(globex.owed, Some(0.25));
        // 0.857 against 0.75 is off by more than 0.05, but over two minutes: not judged.
        assert!(judge(&report, &GOALS).is_empty());
        // The timeline's minutes, the last one partial; owed only where two were backlogged.
        assert_eq!(report.minutes.len(), 4);
        assert_eq!(report.minutes[0].owed, vec![Some(0.75), Some(0.25)]);
        assert_eq!(report.minutes[1].share, vec![Some(0.75), Some(0.25)]);
        assert_eq!(report.minutes[2].share, vec![Some(0.0), Some(1.0)]);
        assert_eq!(report.minutes[2].owed, vec![None, None]);
        assert_eq!(report.minutes[3].share, vec![Some(1.0), Some(0.0)]);
    }

    fn report_with(share: f64, owed: f64, minutes: u64, interactive_p99_s: f64) -> FairnessReport {
        let row = |tenant: &str, share: f64, owed: f64| ShareRow {
            model: SCARCE_MODEL.into(),
            tenant: tenant.into(),
            weight: 1,
            tokens: 1,
            share_of_all: share,
            contested_minutes: minutes,
            share: Some(share),
            owed: Some(owed),
        };
        let wait = |scope: &str, p99_s: f64| WaitRow {
            scope: scope.into(),
            count: 50,
            p50_s: 0.5,
            p99_s,
            max_s: p99_s,
        };
        FairnessReport {
            fairness: "on",
            configuration: String::new(),
            judged_level: BATCH,
            tenants: Vec::new(),
            shares: vec![
                row("acme", share, owed),
                row("globex", 1.0 - share, 1.0 - owed),
            ],
            levels: vec![wait(INTERACTIVE, interactive_p99_s), wait(BATCH, 300.0)],
            minutes: Vec::new(),
        }
    }

    #[test]
    fn the_check_fails_a_share_off_its_weight_and_a_slow_interactive_level() {
        // 0.74 against 0.75, and a p99 of 59.9 s: within ±0.05 and under 60 s.
        assert!(judge(&report_with(0.74, 0.75, 5, 59.9), &GOALS).is_empty());
        assert_eq!(
            judged(&report_with(0.74, 0.75, 5, 59.9), &GOALS),
            "shares of model-a's batch tokens within ±0.05 of the weights' (acme 0.740 of 0.750, globex 0.260 of 0.250); interactive p99 wait 59.9 s within 60 s"
        );
        assert_eq!(
            judged(&report_with(0.74, 0.75, 2, 1.0), &GOALS),
            "no tenant was backlogged on model-a beside another for 3 minutes: shares not judged; interactive p99 wait 1.0 s within 60 s"
        );
        // 0.80 against 0.75 is 0.05 off: still within.
        assert!(judge(&report_with(0.80, 0.75, 5, 1.0), &GOALS).is_empty());
        // 0.69 against 0.75: acme misses by 0.06, and so does globex (0.31 against 0.25).
        assert_eq!(
            judge(&report_with(0.69, 0.75, 5, 1.0), &GOALS),
            vec![
                "tenant acme got 0.690 of model-a's batch tokens while backlogged (5 contested minutes), its weight's share is 0.750 (tolerance ±0.05)".to_owned(),
                "tenant globex got 0.310 of model-a's batch tokens while backlogged (5 contested minutes), its weight's share is 0.250 (tolerance ±0.05)".to_owned(),
            ]
        );
        // The same miss over two contested minutes says too little to judge.
        assert!(judge(&report_with(0.69, 0.75, 2, 1.0), &GOALS).is_empty());
        // An interactive p99 of 60.5 s passes the bound.
        assert_eq!(
            judge(&report_with(0.75, 0.75, 5, 60.5), &GOALS),
            vec![
                "the interactive level's p99 wait was 60.5 s over 50 grants, above its bound of 60.0 s (simulated)".to_owned()
            ]
        );
        // With fairness off nothing is judged: arrival order owes nobody a share.
        let mut off = report_with(0.5, 0.75, 5, 300.0);
        off.fairness = "off";
        assert!(judge(&off, &GOALS).is_empty());
    }

    #[test]
    fn levels_reserve_each_models_tokens_and_contexts_name_tenant_and_level() {
        let config = two_tenants(true);
        let levels = config.levels.as_ref().expect("levels");
        let interactive = levels.iter().next().expect("the first level");
        assert_eq!(interactive.name(), INTERACTIVE);
        assert_eq!(
            interactive.reserved(SCARCE_MODEL),
            Amount::pair(INTERACTIVE_RESERVE_TOKENS, 0)
        );
        // The names the registry and the world give their accounts.
        assert_eq!(interactive.reserved("model-c:window"), Amount::units(2));
        assert_eq!(interactive.reserved("model-c:concurrency"), Amount::ONE);
        assert_eq!(interactive.reserved("model-a:window"), Amount::ZERO);
        assert_eq!(interactive.reserved(HTTP), Amount::units(2));
        assert_eq!(interactive.reserved(DB), Amount::ONE);
        assert_eq!(interactive.reserved(SEARCH), Amount::units(2));
        assert_eq!(levels.rank_of(None), Some(1), "batch is the default");
        let job = JobPlan {
            index: 0,
            name: "agent-000".into(),
            model: SCARCE_MODEL,
            blocking: false,
            start_after: std::time::Duration::ZERO,
            steps: Vec::new(),
            tenant: Some(1),
            interactive: true,
        };
        let ctx = config.context(JobContext::new("agent-000"), &job);
        let snapshot = ctx.snapshot();
        assert_eq!(snapshot.tenant.as_deref(), Some("globex"));
        assert_eq!(snapshot.level.as_deref(), Some(INTERACTIVE));
        assert!(Config::new(Vec::new(), 0, &[]).expect("fine").is_none());
    }
}
