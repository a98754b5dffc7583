//! The fleet's work, drawn once from the seed: which model each agent uses, how many steps it
//! takes, each step's prompt and output sizes, and which steps also touch the database or the
//! search API.
//!
//! The plan is data, made before anything runs, so both strategies of a `--strategy both` run
//! replay exactly the same jobs and the comparison is about admission alone.

use std::time::Duration;

use crate::rng::SplitMix64;

/// The models agents are configured with, and how many agents in a hundred use each. Every id
/// must be in `models.toml`.
pub const MODEL_MIX: [(&str, u64); 3] = [("model-a", 35), ("model-b", 45), ("model-c", 20)];

/// The prompt sizes a step sends, in tokens.
const INPUT_TOKENS: (u64, u64) = (500, 3_000);
/// The `max_tokens` a step declares; charged at admission together with the prompt.
const MAX_OUTPUT_TOKENS: [u64; 4] = [256, 512, 1_024, 2_048];
/// The most tokens one step charges: the largest prompt and the largest declared output.
pub const LARGEST_STEP_TOKENS: u64 = INPUT_TOKENS.1 + MAX_OUTPUT_TOKENS[3];
/// Share of steps that also write to the database (and hold a connection for the step).
const DB_SHARE: f64 = 0.3;
/// Share of steps that also query the external search API (a fixed window of calls).
const SEARCH_SHARE: f64 = 0.2;
/// Agents do not all start at the same instant: each starts within this simulated span.
const START_SPREAD: Duration = Duration::from_secs(60);
/// Interactive agents (`--interactive-percent`) start within this longer span, their draw
/// stretched: they arrive while the batch agents flood the line, not as a burst of their own.
const INTERACTIVE_START_SPREAD: Duration = Duration::from_secs(480);

/// What the command line decides about the workload.
#[derive(Clone, Debug)]
pub struct WorkloadConfig {
    /// How many agents.
    pub jobs: usize,
    /// Steps per agent; `None` draws 2 to 5 per agent.
    pub steps: Option<u32>,
    /// Agents in a hundred that run on a blocking thread with `admit_blocking`.
    pub blocking_percent: u8,
    /// The seed of every draw.
    pub seed: u64,
    /// Agents of each tenant, in order: the first `tenant_agents[0]` agents are the first
    /// tenant's, and so on (empty: no tenants). Drawn from nothing: the plan is the same as
    /// without tenants.
    pub tenant_agents: Vec<u32>,
    /// Agents in a hundred at the interactive level, spread evenly through the plan.
    pub interactive_percent: u8,
}

/// One agent.
#[derive(Clone, Debug)]
pub struct JobPlan {
    /// Position in the plan, from 0.
    pub index: usize,
    /// The agent's name, as events carry it.
    pub name: String,
    /// The model (catalog id) every step calls.
    pub model: &'static str,
    /// True when the agent runs on a blocking thread and admits with `admit_blocking`.
    pub blocking: bool,
    /// Simulated time after the run's start at which the agent begins.
    pub start_after: Duration,
    /// The steps, in order.
    pub steps: Vec<StepPlan>,
    /// The agent's tenant, by its place in `--tenants` (`None`: no tenants).
    pub tenant: Option<usize>,
    /// True when every step of the agent runs at the interactive level.
    pub interactive: bool,
}

/// One step: one LLM call, maybe with a database write and a search query beside it.
#[derive(Clone, Debug)]
pub struct StepPlan {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// The declared most output, charged at admission.
    pub max_output_tokens: u64,
    /// What the model will actually produce (at most the declared most).
    pub output_tokens: u64,
    /// Holds a database connection for the step.
    pub uses_db: bool,
    /// Spends one call of the search API's window.
    pub uses_search: bool,
    /// Simulated time the step's tool work (query, search) adds while it holds everything.
    pub tool_time: Duration,
}

/// Draws the whole plan from `config.seed`.
pub fn plan(config: &WorkloadConfig) -> Vec<JobPlan> {
    let mut rng = SplitMix64::new(config.seed);
    let total_weight: u64 = MODEL_MIX.iter().map(|(_, w)| w).sum();
    let percent = config.blocking_percent.min(100) as usize;
    let interactive_percent = config.interactive_percent.min(100) as usize;
    let tenant_of = |index: usize| {
        let mut end = 0;
        config.tenant_agents.iter().position(|&agents| {
            end += agents as usize;
            index < end
        })
    };
    (0..config.jobs)
        .map(|index| {
            let mut pick = rng.between(0, total_weight - 1);
            let mut model = MODEL_MIX[0].0;
            for (id, weight) in MODEL_MIX {
                if pick < weight {
                    model = id;
                    break;
                }
                pick -= weight;
            }
            let steps = match config.steps {
                Some(n) => n,
                None => u32::try_from(rng.between(2, 5)).unwrap_or(2),
            };
            let start_ms = rng.between(0, START_SPREAD.as_millis() as u64);
            // Exactly as evenly, five places after the blocking agents' spread.
            let interactive = spread(index + 5, interactive_percent);
            let start_ms = if interactive {
                start_ms * INTERACTIVE_START_SPREAD.as_millis() as u64
                    / START_SPREAD.as_millis() as u64
            } else {
                start_ms
            };
            JobPlan {
                index,
                name: format!("agent-{index:03}"),
                model,
                // Exactly `percent` in a hundred, spread evenly through the plan.
                blocking: spread(index, percent),
                start_after: Duration::from_millis(start_ms),
                steps: (0..steps).map(|_| step(&mut rng)).collect(),
                tenant: tenant_of(index),
                interactive,
            }
        })
        .collect()
}

/// Whether place `index` is one of `percent` in a hundred spread evenly.
fn spread(index: usize, percent: usize) -> bool {
    index * percent / 100 != (index + 1) * percent / 100
}

fn step(rng: &mut SplitMix64) -> StepPlan {
    let input_tokens = rng.between(INPUT_TOKENS.0, INPUT_TOKENS.1);
    let max_output_tokens = MAX_OUTPUT_TOKENS[rng.between(0, 3) as usize];
    // Outputs run from 30 % of the declared most up to all of it.
    let output_tokens = (max_output_tokens as f64 * (0.3 + 0.7 * rng.unit())).round() as u64;
    let uses_db = rng.chance(DB_SHARE);
    let uses_search = rng.chance(SEARCH_SHARE);
    let mut tool_ms = 0;
    if uses_db {
        tool_ms += rng.between(300, 1_500);
    }
    if uses_search {
        tool_ms += rng.between(200, 800);
    }
    StepPlan {
        input_tokens,
        max_output_tokens,
        output_tokens: output_tokens.clamp(1, max_output_tokens),
        uses_db,
        uses_search,
        tool_time: Duration::from_millis(tool_ms),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_seed_one_plan_and_the_blocking_share_is_exact() {
        let config = WorkloadConfig {
            jobs: 40,
            steps: None,
            blocking_percent: 10,
            seed: 42,
            tenant_agents: Vec::new(),
            interactive_percent: 0,
        };
        let (a, b) = (plan(&config), plan(&config));
        assert_eq!(a.len(), 40);
        assert_eq!(a.iter().filter(|j| j.blocking).count(), 4);
        for (x, y) in a.iter().zip(&b) {
            assert_eq!((x.model, x.steps.len()), (y.model, y.steps.len()));
        }
        assert!(a.iter().all(|j| j.tenant.is_none() && !j.interactive));
    }

    /// Tenants and the interactive share are laid over the same draws: the plan is the one
    /// without them, the first agents the first tenant's, and the interactive ones as evenly
    /// spread as the blocking ones but not the same.
    #[test]
    fn tenants_and_interactive_agents_leave_the_draws_alone() {
        let plain = WorkloadConfig {
            jobs: 400,
            steps: None,
            blocking_percent: 10,
            seed: 42,
            tenant_agents: Vec::new(),
            interactive_percent: 0,
        };
        let tenants = WorkloadConfig {
            tenant_agents: vec![300, 100],
            interactive_percent: 10,
            ..plain.clone()
        };
        let (a, b) = (plan(&plain), plan(&tenants));
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(
                (x.model, x.steps.len(), x.blocking),
                (y.model, y.steps.len(), y.blocking)
            );
            // An interactive agent's start is its draw stretched eightfold.
            let factor = if y.interactive { 8 } else { 1 };
            assert_eq!(x.start_after * factor, y.start_after);
        }
        assert_eq!(b.iter().filter(|j| j.tenant == Some(0)).count(), 300);
        assert_eq!(b[299].tenant, Some(0));
        assert_eq!(b[300].tenant, Some(1));
        assert_eq!(b.iter().filter(|j| j.interactive).count(), 40);
        assert_eq!(
            b.iter()
                .filter(|j| j.interactive && j.tenant == Some(1))
                .count(),
            10
        );
        assert!(!b.iter().any(|j| j.interactive && j.blocking));
    }
}
