//! The end of a run: a [`RunSummary`] (printed as tables, written as JSON), the side-by-side
//! comparison of the two strategies, and the `--check` rules CI relies on.
//!
//! Waits and spans are in simulated time, the unit the budgets are written in; the real time of
//! the run is given once at the top.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use admission_llm::spend::Money;
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::events::Counts;
use crate::fairness::{self, FairnessReport};
use crate::progress::clock_text;
use crate::provider_sim::UpstreamStats;
use crate::stats::Outcomes;
use crate::timeline::Peak;

/// One limit's use over the run.
#[derive(Clone, Debug, Serialize)]
pub struct LimitRow {
    /// The limit's name.
    pub name: String,
    /// What it counts.
    pub unit: &'static str,
    /// Its capacity (at the peak sample, for a bucket whose budget the headers corrected).
    pub capacity: u64,
    /// The most in use in any sample.
    pub peak_sampled: u64,
    /// The most holders at once, counted at every grant (permit limits only).
    pub peak_exact: Option<u64>,
    /// In use once every job ended (permit limits only): anything but 0 is a leak.
    pub in_use_after: Option<u64>,
}

/// Admission waits of one scope, in simulated seconds.
#[derive(Clone, Debug, Serialize)]
pub struct WaitRow {
    /// A model, or `all`.
    pub scope: String,
    /// Grants counted.
    pub count: u64,
    /// Median wait.
    pub p50_s: f64,
    /// 99th percentile.
    pub p99_s: f64,
    /// Longest.
    pub max_s: f64,
}

/// One model's calls.
#[derive(Clone, Debug, Serialize)]
pub struct ModelRow {
    /// The catalog id.
    pub model: String,
    /// Tokens per minute the catalog says.
    pub catalog_tpm: u64,
    /// What the provider really allows.
    pub upstream_tpm: u64,
    /// Tokens charged by the provider per simulated minute, from the start of the run until the
    /// model's last job ended.
    pub achieved_tpm: u64,
    /// Calls that ran.
    pub calls_ok: u64,
    /// Tokens the provider charged (prompt + declared most output of accepted calls).
    pub tokens_charged: u64,
    /// 429 answers.
    pub rate_limited: u64,
    /// 529 answers.
    pub overloaded: u64,
    /// Refusals by the model's open circuit.
    pub circuit_refusals: u64,
    /// Jobs of the model that ended.
    pub jobs_done: u64,
    /// When the model's last job ended, simulated seconds.
    pub last_job_done_s: f64,
    /// The highest throttle its bucket reached.
    pub throttle_peak: f64,
    /// The most calls the provider had in flight on it.
    pub upstream_peak_in_flight: u64,
    /// Calls that arrived above the provider's true concurrency cap.
    pub over_concurrency: u64,
}

/// The results database, read back once every job ended (monitor runs only).
#[derive(Clone, Debug, Serialize)]
pub struct ResultsReading {
    /// The SQLite file.
    pub path: String,
    /// Rows the `results` table holds.
    pub rows: u64,
    /// Steps that committed a result, as the jobs counted them.
    pub stored: u64,
    /// Pool connections still checked out: anything but 0 is a leak.
    pub checked_out: u64,
}

/// What the workflows spent against their spend caps (each agent is one workflow with the same
/// cap). Amounts in the catalog's currency.
#[derive(Clone, Debug, Serialize)]
pub struct SpendReading {
    /// Workflows (agents), each with its own cap.
    pub workflows: u64,
    /// One workflow's cap.
    pub cap_each: Money,
    /// What every workflow spent, settled from the answers' usage.
    pub spent: Money,
    /// The most one workflow spent.
    pub most_spent: Money,
    /// Steps whose price a cap refused before they waited (each ends its workflow).
    pub refused_for_money: u64,
}

impl SpendReading {
    /// The caps of every workflow together.
    pub fn cap_total(&self) -> Money {
        Money::from_micros(self.cap_each.micros().saturating_mul(self.workflows))
    }
}

/// Everything a run reports.
#[derive(Clone, Debug, Serialize)]
pub struct RunSummary {
    /// `monitor` or `hold-and-wait`.
    pub strategy: &'static str,
    /// Agents.
    pub jobs: u64,
    /// Agents that ran on blocking threads with `admit_blocking` (monitor runs only).
    pub blocking_jobs: u64,
    /// The workload's seed.
    pub seed: u64,
    /// Simulated seconds per real second.
    pub time_scale: u32,
    /// Real seconds the run took.
    pub real_seconds: f64,
    /// Simulated seconds the run took.
    pub simulated_seconds: f64,
    /// Why the run ended early, if it did.
    pub interrupted: Option<String>,
    /// How the jobs ended.
    pub outcomes: Outcomes,
    /// Grants (admissions or chain acquisitions).
    pub grants: u64,
    /// Retried calls.
    pub retries: u64,
    /// Per limit.
    pub limits: Vec<LimitRow>,
    /// Per model and overall.
    pub waits: Vec<WaitRow>,
    /// Per model.
    pub models: Vec<ModelRow>,
    /// The monitor's events (monitor runs only).
    pub events: Option<Counts>,
    /// HTTP connection time held, in simulated connection-minutes.
    pub http_connection_minutes: f64,
    /// The share of that time a connection sat held by a step still waiting for another limit.
    pub http_idle_share: f64,
    /// Tokens debited by steps that then timed out waiting for another limit.
    pub tokens_stranded: u64,
    /// The longest line sampled.
    pub longest_line: u64,
    /// Limits still held, or waiters still parked, after the run.
    pub leaks: Vec<String>,
    /// The results database (monitor runs only).
    pub results: Option<ResultsReading>,
    /// The workflows' spend against their caps.
    pub spend: SpendReading,
    /// The first failure messages.
    pub failures: Vec<String>,
    /// Files written.
    pub files: Vec<String>,
    /// The tenants' shares and the levels' waits, with `--tenants` or `--interactive-percent`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fairness: Option<FairnessReport>,
}

/// The rows of the wait table from the histograms (microseconds).
pub fn wait_rows(waits: &BTreeMap<String, Histogram<u64>>) -> Vec<WaitRow> {
    let secs = |micros: u64| micros as f64 / 1e6;
    waits
        .iter()
        .map(|(scope, h)| WaitRow {
            scope: scope.clone(),
            count: h.len(),
            p50_s: secs(h.value_at_quantile(0.5)),
            p99_s: secs(h.value_at_quantile(0.99)),
            max_s: secs(h.max()),
        })
        .collect()
}

/// The limit rows from the sampled peaks, the exact gauges and the after-run readings.
pub fn limit_rows(
    peaks: &[Peak],
    exact: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> Vec<LimitRow> {
    peaks
        .iter()
        .map(|p| LimitRow {
            name: p.name.clone(),
            unit: p.unit,
            capacity: p.capacity,
            peak_sampled: p.peak,
            peak_exact: exact.get(&p.name).copied(),
            in_use_after: after.get(&p.name).copied(),
        })
        .collect()
}

/// The model rows.
pub fn model_rows(
    catalog_tpm: &BTreeMap<String, u64>,
    upstream: &BTreeMap<String, UpstreamStats>,
    tallies: &BTreeMap<String, ModelTallyReading>,
    throttle_peaks: &[(String, f64)],
) -> Vec<ModelRow> {
    catalog_tpm
        .iter()
        .map(|(model, &catalog)| {
            let up = upstream.get(model).cloned().unwrap_or_default();
            let tally = tallies.get(model).cloned().unwrap_or_default();
            let minutes = tally.last_job_done_s / 60.0;
            ModelRow {
                model: model.clone(),
                catalog_tpm: catalog,
                upstream_tpm: up.true_tokens_per_minute,
                achieved_tpm: if minutes > 0.0 {
                    (up.tokens_charged as f64 / minutes) as u64
                } else {
                    0
                },
                calls_ok: tally.calls_ok,
                tokens_charged: up.tokens_charged,
                rate_limited: tally.rate_limited,
                overloaded: tally.overloaded,
                circuit_refusals: tally.circuit_refusals,
                jobs_done: tally.jobs_done,
                last_job_done_s: tally.last_job_done_s,
                throttle_peak: throttle_peaks
                    .iter()
                    .find(|(m, _)| m == model)
                    .map_or(0.0, |(_, t)| *t),
                upstream_peak_in_flight: up.peak_in_flight,
                over_concurrency: up.over_concurrency,
            }
        })
        .collect()
}

/// A model's counters, read once.
#[derive(Clone, Debug, Default)]
pub struct ModelTallyReading {
    /// Calls that ran.
    pub calls_ok: u64,
    /// 429s.
    pub rate_limited: u64,
    /// 529s.
    pub overloaded: u64,
    /// Open-circuit refusals.
    pub circuit_refusals: u64,
    /// Jobs ended.
    pub jobs_done: u64,
    /// When the last ended, simulated seconds.
    pub last_job_done_s: f64,
}

/// Simulated seconds as `12.3s` or `4m10s`.
pub fn span(seconds: f64) -> String {
    if seconds < 60.0 {
        format!("{seconds:.1}s")
    } else {
        clock_text(seconds)
    }
}

impl RunSummary {
    /// The run's name: its strategy, and whether the monitor kept fair shares when there are
    /// tenants or levels (`monitor, fairness on`).
    pub fn label(&self) -> String {
        match &self.fairness {
            Some(f) if self.strategy == "monitor" => {
                format!("{}, fairness {}", self.strategy, f.fairness)
            }
            _ => self.strategy.to_owned(),
        }
    }

    /// The wait row of `scope`.
    pub fn wait(&self, scope: &str) -> Option<&WaitRow> {
        self.waits.iter().find(|w| w.scope == scope)
    }

    /// The model row of `model`.
    pub fn model(&self, model: &str) -> Option<&ModelRow> {
        self.models.iter().find(|m| m.model == model)
    }

    /// The limit row of `name`.
    pub fn limit(&self, name: &str) -> Option<&LimitRow> {
        self.limits.iter().find(|l| l.name == name)
    }

    /// The summary as printed tables.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let o = &self.outcomes;
        let _ = writeln!(
            out,
            "== {}: {} agents ({}), seed {}, time scale {}x (1 simulated minute = {:.2} s real) ==",
            self.label(),
            self.jobs,
            if self.strategy == "monitor" {
                format!(
                    "{} on blocking threads with admit_blocking",
                    self.blocking_jobs
                )
            } else {
                "all as async tasks".to_owned()
            },
            self.seed,
            self.time_scale,
            60.0 / f64::from(self.time_scale)
        );
        if let Some(reason) = &self.interrupted {
            let _ = writeln!(out, "INTERRUPTED: {reason}");
        }
        let _ = writeln!(
            out,
            "ran {:.1} s real = {} simulated; jobs: {} completed, {} over budget, {} gave up, {} timed out, {} cancelled, {} failed, {} never ended",
            self.real_seconds,
            span(self.simulated_seconds),
            o.completed,
            o.over_budget,
            o.gave_up,
            o.timed_out,
            o.cancelled,
            o.failed,
            o.total.saturating_sub(o.ended())
        );
        let sp = &self.spend;
        let _ = writeln!(
            out,
            "spend: {} spent of {} capped ({} workflows x {}), most by one workflow {}; {} calls refused for money",
            sp.spent,
            sp.cap_total(),
            sp.workflows,
            sp.cap_each,
            sp.most_spent,
            sp.refused_for_money
        );
        let _ = writeln!(
            out,
            "grants {}, retried calls {}, longest line {}",
            self.grants, self.retries, self.longest_line
        );

        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "{:<22} {:<16} {:>9} {:>12} {:>11} {:>9}",
            "limit", "counts", "capacity", "peak sampled", "peak exact", "after run"
        );
        for l in &self.limits {
            let opt = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
            let _ = writeln!(
                out,
                "{:<22} {:<16} {:>9} {:>12} {:>11} {:>9}",
                l.name,
                l.unit,
                l.capacity,
                l.peak_sampled,
                opt(l.peak_exact),
                opt(l.in_use_after)
            );
        }

        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "{:<8} {:>11} {:>12} {:>12} {:>6} {:>4} {:>4} {:>8} {:>9} {:>9} {:>9}",
            "model",
            "catalog tpm",
            "upstream tpm",
            "achieved tpm",
            "calls",
            "429",
            "529",
            "throttle",
            "last job",
            "wait p50",
            "wait p99"
        );
        for m in &self.models {
            let wait = self.wait(&m.model);
            let _ = writeln!(
                out,
                "{:<8} {:>11} {:>12} {:>12} {:>6} {:>4} {:>4} {:>7.1}x {:>9} {:>9} {:>9}",
                m.model,
                m.catalog_tpm,
                m.upstream_tpm,
                m.achieved_tpm,
                m.calls_ok,
                m.rate_limited,
                m.overloaded,
                1.0 + m.throttle_peak,
                span(m.last_job_done_s),
                wait.map_or_else(|| "-".to_owned(), |w| span(w.p50_s)),
                wait.map_or_else(|| "-".to_owned(), |w| span(w.p99_s)),
            );
        }
        let _ = writeln!(
            out,
            "(achieved tpm: tokens the provider charged, prompt + max_tokens, per simulated minute until the model's last job ended; throttle: the most the bucket's refill was slowed, 1 + x)"
        );
        if let Some(all) = self.wait("all") {
            let _ = writeln!(
                out,
                "all waits: {} grants, p50 {}, p99 {}, max {} (simulated)",
                all.count,
                span(all.p50_s),
                span(all.p99_s),
                span(all.max_s)
            );
        }
        let _ = writeln!(
            out,
            "HTTP connections: {:.0} connection-minutes held, {:.1} % of it by steps still waiting for another limit; tokens stranded by timeouts: {}",
            self.http_connection_minutes,
            100.0 * self.http_idle_share,
            self.tokens_stranded
        );
        if let Some(events) = &self.events {
            let kinds: Vec<String> = events
                .kinds
                .iter()
                .map(|(k, n)| format!("{k} {n}"))
                .collect();
            let _ = writeln!(out, "events: {}", kinds.join(", "));
            if !events.held_on.is_empty() {
                let held: Vec<String> = events
                    .held_on
                    .iter()
                    .map(|(k, n)| format!("{k} {n}"))
                    .collect();
                let _ = writeln!(out, "  held on: {}", held.join(", "));
            }
            if !events.rejected.is_empty() {
                let rejected: Vec<String> = events
                    .rejected
                    .iter()
                    .map(|(k, n)| format!("{k} {n}"))
                    .collect();
                let _ = writeln!(out, "  rejected: {}", rejected.join(", "));
            }
        }
        if let Some(f) = &self.fairness {
            let _ = writeln!(out);
            out.push_str(&f.render());
            let _ = writeln!(out);
        }
        if let Some(r) = &self.results {
            let _ = writeln!(
                out,
                "results database: {} rows read back from {} ({} steps stored a result), {} connections checked out",
                r.rows, r.path, r.stored, r.checked_out
            );
        }
        for failure in &self.failures {
            let _ = writeln!(out, "failure: {failure}");
        }
        for leak in &self.leaks {
            let _ = writeln!(out, "LEAK: {leak}");
        }
        for file in &self.files {
            let _ = writeln!(out, "wrote {file}");
        }
        out
    }

    /// What `--check` finds wrong with this run; empty when it passes.
    ///
    /// Nothing over capacity (exact peaks and sampled peaks of every permit limit, the provider's
    /// true concurrency never exceeded), every job ended and none was cancelled or failed (nor,
    /// under the monitor, timed out), nothing held or parked once the run is over, and the
    /// results database holds one row per stored result with no connection checked out. A job
    /// its workflow's spend cap stopped is an expected end; a workflow that spent past its cap
    /// is a problem.
    pub fn problems(&self) -> Vec<String> {
        self.problems_judging(true)
    }

    /// [`RunSummary::problems`] but for jobs that timed out or failed, which a fleet member
    /// leaves to its parent: the parent judges each against the outage of a `--chaos` run.
    pub fn problems_but_failed_jobs(&self) -> Vec<String> {
        self.problems_judging(false)
    }

    /// The problems, with or without the timed-out and failed jobs.
    fn problems_judging(&self, failed_jobs: bool) -> Vec<String> {
        let mut problems = Vec::new();
        let label = self.label();
        let name = label.as_str();
        if let Some(reason) = &self.interrupted {
            problems.push(format!("{name}: interrupted ({reason})"));
        }
        let o = &self.outcomes;
        // Every job must end under the monitor. The chain is the design admission rules out:
        // its timeouts are a finding to report, not a failure of the example.
        let strict = self.strategy == "monitor";
        if o.ended() != o.total {
            problems.push(format!(
                "{name}: {} of {} jobs never ended",
                o.total - o.ended().min(o.total),
                o.total
            ));
        }
        for (what, n, judged) in [
            ("timed out", o.timed_out, true),
            ("were cancelled", o.cancelled, false),
            ("failed", o.failed, true),
        ] {
            if judged && !failed_jobs {
                continue;
            }
            if n > 0 && (strict || what != "timed out") {
                problems.push(format!("{name}: {n} jobs {what}"));
            }
        }
        // Answers never bill past what a step declared, so no workflow may pass its cap.
        if self.spend.most_spent > self.spend.cap_each {
            problems.push(format!(
                "{name}: a workflow spent {} past its cap {}",
                self.spend.most_spent, self.spend.cap_each
            ));
        }
        if self.spend.refused_for_money != o.over_budget {
            problems.push(format!(
                "{name}: {} calls refused for money but {} jobs ended over budget",
                self.spend.refused_for_money, o.over_budget
            ));
        }
        for l in &self.limits {
            let permits = l.peak_exact.is_some();
            if let Some(exact) = l.peak_exact
                && exact > l.capacity
            {
                problems.push(format!(
                    "{name}: `{}` had {exact} holders at once, capacity {}",
                    l.name, l.capacity
                ));
            }
            if permits && l.peak_sampled > l.capacity {
                problems.push(format!(
                    "{name}: `{}` read {} in use, capacity {}",
                    l.name, l.peak_sampled, l.capacity
                ));
            }
            if let Some(after) = l.in_use_after
                && after != 0
            {
                problems.push(format!(
                    "{name}: `{}` still had {after} in use after the run",
                    l.name
                ));
            }
        }
        for m in &self.models {
            if m.over_concurrency > 0 {
                problems.push(format!(
                    "{name}: the provider saw {} calls on {} above its concurrency cap",
                    m.over_concurrency, m.model
                ));
            }
        }
        if let Some(r) = &self.results {
            if r.rows != r.stored {
                problems.push(format!(
                    "{name}: the results database holds {} rows, {} steps stored a result",
                    r.rows, r.stored
                ));
            }
            if r.checked_out != 0 {
                problems.push(format!(
                    "{name}: {} results connections still checked out after the run",
                    r.checked_out
                ));
            }
        }
        problems.extend(self.leaks.iter().map(|l| format!("{name}: {l}")));
        if let Some(f) = &self.fairness {
            problems.extend(
                fairness::judge(f, &fairness::GOALS)
                    .into_iter()
                    .map(|p| format!("{name}: {p}")),
            );
        }
        problems
    }
}

/// The two runs side by side (the two strategies, or the monitor with fairness on and off): the
/// rows where they differ.
pub fn side_by_side(monitor: &RunSummary, chain: &RunSummary) -> String {
    let mut rows: Vec<(String, String, String)> = Vec::new();
    let mut row = |what: &str, f: &dyn Fn(&RunSummary) -> String| {
        rows.push((what.to_owned(), f(monitor), f(chain)));
    };
    row("run ended by", &|s| {
        s.interrupted
            .clone()
            .unwrap_or_else(|| "its last job".to_owned())
    });
    row("real time", &|s| format!("{:.1} s", s.real_seconds));
    row("simulated time", &|s| span(s.simulated_seconds));
    row("jobs completed", &|s| {
        format!("{} / {}", s.outcomes.completed, s.outcomes.total)
    });
    row("jobs over budget / refused for money", &|s| {
        format!("{} / {}", s.outcomes.over_budget, s.spend.refused_for_money)
    });
    row("spent of capped", &|s| {
        format!("{} of {}", s.spend.spent, s.spend.cap_total())
    });
    row("jobs timed out / gave up", &|s| {
        format!("{} / {}", s.outcomes.timed_out, s.outcomes.gave_up)
    });
    for model in monitor.models.iter().map(|m| m.model.clone()) {
        let m = model.clone();
        row(&format!("{model}: achieved tpm"), &|s| {
            s.model(&m).map_or("-".into(), |r| {
                format!("{} of {}", r.achieved_tpm, r.upstream_tpm)
            })
        });
        let m = model.clone();
        row(&format!("{model}: last job done"), &|s| {
            s.model(&m).map_or("-".into(), |r| span(r.last_job_done_s))
        });
        let m = model.clone();
        row(&format!("{model}: wait p50 / p99"), &|s| {
            s.wait(&m).map_or("-".into(), |w| {
                format!("{} / {}", span(w.p50_s), span(w.p99_s))
            })
        });
    }
    row("all waits p50 / p99", &|s| {
        s.wait("all").map_or("-".into(), |w| {
            format!("{} / {}", span(w.p50_s), span(w.p99_s))
        })
    });
    row("HTTP connection-minutes held", &|s| {
        format!("{:.0}", s.http_connection_minutes)
    });
    row("  of which waiting for other limits", &|s| {
        format!("{:.1} %", 100.0 * s.http_idle_share)
    });
    row("HTTP peak in use", &|s| {
        s.limit(crate::world::HTTP).map_or("-".into(), |l| {
            format!("{} / {}", l.peak_sampled, l.capacity)
        })
    });
    row("longest line", &|s| s.longest_line.to_string());
    row("429s / 529s", &|s| {
        let (a, b) = s
            .models
            .iter()
            .fold((0, 0), |(a, b), m| (a + m.rate_limited, b + m.overloaded));
        format!("{a} / {b}")
    });
    row("tokens stranded by timeouts", &|s| {
        s.tokens_stranded.to_string()
    });
    if let Some(f) = &monitor.fairness {
        for t in &f.tenants {
            let tenant = t.tenant.clone();
            row(&format!("{tenant}: wait p50 / p99"), &|s| {
                s.fairness
                    .as_ref()
                    .and_then(|f| f.tenants.iter().find(|r| r.tenant == tenant))
                    .map_or("-".into(), |r| {
                        format!("{} / {}", span(r.waits.p50_s), span(r.waits.p99_s))
                    })
            });
        }
        for t in &f.tenants {
            let tenant = t.tenant.clone();
            row(
                &format!("{tenant}: {} share / owed", fairness::SCARCE_MODEL),
                &|s| {
                    s.fairness
                        .as_ref()
                        .and_then(|f| f.share(fairness::SCARCE_MODEL, &tenant))
                        .map_or("-".into(), |r| match (r.share, r.owed) {
                            (Some(share), Some(owed)) => {
                                format!("{share:.3} / {owed:.3} ({} m)", r.contested_minutes)
                            }
                            _ => "-".into(),
                        })
                },
            );
        }
        for level in &f.levels {
            let name = level.scope.clone();
            row(&format!("{name} level: wait p50 / p99"), &|s| {
                s.fairness
                    .as_ref()
                    .and_then(|f| f.level(&name))
                    .map_or("-".into(), |w| {
                        format!("{} / {}", span(w.p50_s), span(w.p99_s))
                    })
            });
        }
    }

    let mut out = String::new();
    let _ = writeln!(
        out,
        "== side by side: the same {} agents, seed {} ==",
        monitor.jobs, monitor.seed
    );
    let _ = writeln!(
        out,
        "{:<36} {:>22} {:>22}",
        "",
        monitor.label(),
        chain.label()
    );
    for (what, a, b) in rows {
        let _ = writeln!(out, "{what:<36} {a:>22} {b:>22}");
    }
    out
}
