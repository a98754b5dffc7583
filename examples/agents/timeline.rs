//! The run's timeline: periodic samples of every limit's occupancy, of the line's length and of
//! the adaptive throttles, and the SVG picture drawn from them (plotters, SVG backend).
//!
//! Sampling is for the picture and the "peak use" column; the exact no-over-grant check uses the
//! gauges in `stats.rs`, which see every grant rather than one moment in fifty milliseconds.

use std::path::Path;

use anyhow::anyhow;
use plotters::prelude::*;

/// Reads one number.
pub type Read = Box<dyn Fn() -> u64 + Send + Sync>;
/// Reads one throttle.
pub type ReadThrottle = Box<dyn Fn() -> f64 + Send + Sync>;

/// One limit to sample: its name, how much of it is in use, and its capacity (which may change,
/// as a bucket's does when the provider's headers correct it).
pub struct Probe {
    /// The limit's name.
    pub name: String,
    /// What it counts ("connections", "tokens", ...).
    pub unit: &'static str,
    /// In use now.
    pub in_use: Read,
    /// Capacity now.
    pub capacity: Read,
}

/// Everything the sampler reads.
pub struct Probes {
    /// The limits.
    pub accounts: Vec<Probe>,
    /// The line: parked waiters (monitor) or steps still acquiring (chain).
    pub line: Read,
    /// HTTP connections held by steps still waiting for another limit.
    pub holding_while_waiting: Read,
    /// The adaptive throttle of each model's bucket, by model.
    pub throttles: Vec<(String, ReadThrottle)>,
}

/// One moment.
#[derive(Clone, Debug)]
pub struct Sample {
    /// Simulated seconds since the run began.
    pub t: f64,
    /// Parked (or acquiring) steps.
    pub line: u64,
    /// HTTP connections held while waiting.
    pub holding_while_waiting: u64,
    /// `(in use, capacity)` per probe, in probe order.
    pub accounts: Vec<(u64, u64)>,
    /// Throttle per model, in probe order.
    pub throttles: Vec<f64>,
}

/// The peak of one limit over the run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Peak {
    /// The limit's name.
    pub name: String,
    /// What it counts.
    pub unit: &'static str,
    /// The most in use in any sample.
    pub peak: u64,
    /// The capacity in force at that sample.
    pub capacity: u64,
    /// The largest share of capacity in use in any sample.
    pub peak_share: f64,
}

/// The samples of a run.
#[derive(Debug)]
pub struct Timeline {
    /// Probe names, with units.
    pub names: Vec<(String, &'static str)>,
    /// Models, in throttle order.
    pub models: Vec<String>,
    /// The samples, oldest first.
    pub samples: Vec<Sample>,
    /// With tenants: each tenant's share per simulated minute, drawn as a fifth panel.
    pub shares: Option<SharePanel>,
}

/// Each tenant's share of a model's tokens per simulated minute.
#[derive(Clone, Debug)]
pub struct SharePanel {
    /// What the shares are of.
    pub title: String,
    /// Per tenant: its label, its share per minute (`(minute's middle, share)`, 0 to 1), and
    /// its weight's share in the minutes it was owed one.
    pub tenants: Vec<TenantShares>,
}

/// One tenant's line of the share panel.
#[derive(Clone, Debug)]
pub struct TenantShares {
    /// Its name and weight.
    pub label: String,
    /// `(simulated minutes, share)`.
    pub share: Vec<(f64, f64)>,
    /// `(simulated minutes, weight's share)` in the minutes it was owed one; runs of minutes
    /// are drawn as lines, single minutes as dots.
    pub owed: Vec<(f64, f64)>,
}

impl Probes {
    /// Reads everything now.
    pub fn sample(&self, t: f64) -> Sample {
        Sample {
            t,
            line: (self.line)(),
            holding_while_waiting: (self.holding_while_waiting)(),
            accounts: self
                .accounts
                .iter()
                .map(|p| ((p.in_use)(), (p.capacity)()))
                .collect(),
            throttles: self.throttles.iter().map(|(_, read)| read()).collect(),
        }
    }

    /// An empty timeline for these probes.
    pub fn timeline(&self) -> Timeline {
        Timeline {
            names: self
                .accounts
                .iter()
                .map(|p| (p.name.clone(), p.unit))
                .collect(),
            models: self.throttles.iter().map(|(m, _)| m.clone()).collect(),
            samples: Vec::new(),
            shares: None,
        }
    }
}

impl Timeline {
    /// Each limit's peak.
    pub fn peaks(&self) -> Vec<Peak> {
        self.names
            .iter()
            .enumerate()
            .map(|(i, (name, unit))| {
                let mut peak = Peak {
                    name: name.clone(),
                    unit,
                    peak: 0,
                    capacity: 0,
                    peak_share: 0.0,
                };
                for sample in &self.samples {
                    let (in_use, capacity) = sample.accounts[i];
                    if in_use > peak.peak || peak.capacity == 0 {
                        peak.peak = peak.peak.max(in_use);
                        peak.capacity = capacity;
                    }
                    if capacity > 0 {
                        peak.peak_share = peak.peak_share.max(in_use as f64 / capacity as f64);
                    }
                }
                peak
            })
            .collect()
    }

    /// The highest throttle each model's bucket reached.
    pub fn throttle_peaks(&self) -> Vec<(String, f64)> {
        self.models
            .iter()
            .enumerate()
            .map(|(i, model)| {
                let peak = self
                    .samples
                    .iter()
                    .map(|s| s.throttles[i])
                    .fold(0.0, f64::max);
                (model.clone(), peak)
            })
            .collect()
    }

    /// The longest line seen.
    pub fn longest_line(&self) -> u64 {
        self.samples.iter().map(|s| s.line).max().unwrap_or(0)
    }

    /// Draws the timeline as an SVG at `path`, simulated minutes across, four panels: the
    /// occupancy (percent of capacity) of the limits held until a call ends, then of those given
    /// back by time (tokens spent and not yet refilled, calls in a window), the line's length with
    /// the HTTP connections held by steps still waiting, and each bucket's throttle; with
    /// [`shares`](Timeline::shares), a fifth: each tenant's share per simulated minute (solid,
    /// one colour per tenant) and its weight's share where it was owed one (dashed).
    ///
    /// # Errors
    ///
    /// When the file cannot be written.
    pub fn draw_svg(&self, path: &Path, title: &str) -> anyhow::Result<()> {
        self.draw(path, title)
            .map_err(|e| anyhow!("drawing {}: {e}", path.display()))
    }

    fn draw(&self, path: &Path, title: &str) -> Result<(), Box<dyn std::error::Error>> {
        let minutes = |s: &Sample| s.t / 60.0;
        let t_max = self.samples.last().map_or(0.0, minutes).max(0.1);
        // One color per limit, shared by a model's token bucket and its throttle.
        let color = |name: &str| {
            let index = self.names.iter().position(|(n, _)| n == name).unwrap_or(0);
            COLORS[index % COLORS.len()]
        };
        let share = |(in_use, capacity): (u64, u64)| {
            if capacity == 0 {
                0.0
            } else {
                100.0 * in_use as f64 / capacity as f64
            }
        };
        let occupancy = |held: bool| -> Vec<Series> {
            self.names
                .iter()
                .enumerate()
                .filter(|(_, (_, unit))| is_held(unit) == held)
                .map(|(i, (name, unit))| Series {
                    label: format!("{name} ({unit})"),
                    color: color(name),
                    points: self
                        .samples
                        .iter()
                        .map(|s| (minutes(s), share(s.accounts[i])))
                        .collect(),
                })
                .collect()
        };
        let line = vec![
            Series {
                label: "steps waiting".into(),
                color: RGBColor(31, 119, 180),
                points: self
                    .samples
                    .iter()
                    .map(|s| (minutes(s), s.line as f64))
                    .collect(),
            },
            Series {
                label: "HTTP connections held by steps still waiting".into(),
                color: RGBColor(214, 39, 40),
                points: self
                    .samples
                    .iter()
                    .map(|s| (minutes(s), s.holding_while_waiting as f64))
                    .collect(),
            },
        ];
        let throttles: Vec<Series> = self
            .models
            .iter()
            .enumerate()
            .map(|(i, model)| Series {
                label: format!("{model} throttle"),
                color: color(model),
                points: self
                    .samples
                    .iter()
                    .map(|s| (minutes(s), s.throttles[i]))
                    .collect(),
            })
            .collect();

        let count = 4 + usize::from(self.shares.is_some());
        let height = 315 * u32::try_from(count).unwrap_or(4);
        let root = SVGBackend::new(path, (1200, height)).into_drawing_area();
        root.fill(&WHITE)?;
        let root = root.titled(title, ("sans-serif", 22))?;
        let panels = root.split_evenly((count, 1));
        panel(
            &panels[0],
            "% in use: held until the call ends",
            t_max,
            105.0,
            &occupancy(true),
            SeriesLabelPosition::UpperRight,
        )?;
        panel(
            &panels[1],
            "% in use: given back by time",
            t_max,
            105.0,
            &occupancy(false),
            SeriesLabelPosition::MiddleRight,
        )?;
        panel(
            &panels[2],
            "steps in line",
            t_max,
            top_of(&line, 1.0),
            &line,
            SeriesLabelPosition::UpperRight,
        )?;
        panel(
            &panels[3],
            "bucket throttle (refill / (1 + x))",
            t_max,
            top_of(&throttles, 1.0),
            &throttles,
            SeriesLabelPosition::UpperRight,
        )?;
        if let Some(shares) = &self.shares {
            share_panel(&panels[4], shares, t_max)?;
        }
        root.present()?;
        Ok(())
    }
}

/// A palette that tells ten lines apart.
const COLORS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// True for limits whose units come back when a call ends (connections, concurrency slots).
pub fn is_held(unit: &str) -> bool {
    unit == "connections" || unit == "calls in flight"
}

/// One line of a panel.
struct Series {
    label: String,
    color: RGBColor,
    points: Vec<(f64, f64)>,
}

/// 110 % of the highest point, at least `floor`.
fn top_of(series: &[Series], floor: f64) -> f64 {
    series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(floor, f64::max)
        * 1.1
}

/// The share panel: each tenant's share per minute, solid, and its owed share, dashed, in its
/// colour; percent up.
fn share_panel(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    shares: &SharePanel,
    t_max: f64,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut chart = ChartBuilder::on(area)
        .margin(12)
        .x_label_area_size(32)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..t_max, 0.0..105.0)?;
    chart
        .configure_mesh()
        .x_desc("simulated minutes")
        .y_desc(shares.title.as_str())
        .draw()?;
    let within = |points: &[(f64, f64)]| -> Vec<(f64, f64)> {
        points
            .iter()
            .filter(|(t, _)| *t <= t_max)
            .map(|&(t, share)| (t, 100.0 * share))
            .collect()
    };
    for (i, tenant) in shares.tenants.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(
                within(&tenant.share),
                color.stroke_width(2),
            ))?
            .label(tenant.label.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        // Owed shares in runs of consecutive minutes, so a gap is not bridged.
        let owed = within(&tenant.owed);
        let mut runs: Vec<Vec<(f64, f64)>> = Vec::new();
        for point in owed {
            match runs.last_mut() {
                Some(run)
                    if run
                        .last()
                        .is_some_and(|last| point.0 - last.0 <= 1.0 + 1e-9) =>
                {
                    run.push(point);
                }
                _ => runs.push(vec![point]),
            }
        }
        for (r, run) in runs.into_iter().enumerate() {
            let style = color.stroke_width(1);
            let drawn = if run.len() == 1 {
                chart.draw_series(run.into_iter().map(|p| Circle::new(p, 3, style)))?
            } else {
                chart.draw_series(DashedLineSeries::new(run, 6, 4, style))?
            };
            if r == 0 {
                drawn
                    .label(format!("{} owed (backlogged minutes)", tenant.label))
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 6, y)], color.stroke_width(1))
                    });
            }
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.7))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// One chart: simulated minutes across, `y_desc` up, the legend at `legend`.
fn panel(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    y_desc: &str,
    t_max: f64,
    y_max: f64,
    series: &[Series],
    legend: SeriesLabelPosition,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut chart = ChartBuilder::on(area)
        .margin(12)
        .x_label_area_size(32)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..t_max, 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("simulated minutes")
        .y_desc(y_desc)
        .draw()?;
    for s in series {
        let color = s.color;
        chart
            .draw_series(LineSeries::new(
                s.points.iter().copied(),
                color.stroke_width(2),
            ))?
            .label(s.label.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(legend)
        .background_style(WHITE.mix(0.7))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}
