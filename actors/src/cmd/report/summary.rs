//! `summary.md`: the run at a glance, the first and last window means of every series, the plots.
//!
//! The run's settings come from its resolved `config.toml`, read as plain TOML rather than as
//! kevin's current `ConfigFile`, so a run written by an older kevin (other keys) still gets its
//! summary; a missing or unreadable config only costs the lines that need it, with a warning.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::series::Chart;
use super::{MetricsLog, CONFIG_FILE};

/// Warnings the summary lists one by one; a badly damaged file would otherwise drown it.
const WARNINGS_LISTED: usize = 50;

/// What the summary says about the run besides its metrics.
#[derive(Clone, Debug)]
pub struct RunInfo {
    /// The run directory.
    pub run_dir: PathBuf,
    /// `run.name` from the config, else the directory's name.
    pub name: String,
    /// The resolved config's text, when readable.
    pub config_text: Option<String>,
    /// The parsed config, when it parses.
    pub config: Option<toml::Table>,
}

impl RunInfo {
    /// Reads `run_dir/config.toml`; what cannot be read becomes a warning.
    pub fn read(run_dir: &Path, warnings: &mut Vec<String>) -> RunInfo {
        let path = run_dir.join(CONFIG_FILE);
        let config_text = match std::fs::read_to_string(&path) {
            Ok(t) => Some(t),
            Err(e) => {
                warnings.push(format!(
                    "cannot read {}: {e}; the summary has no config",
                    path.display()
                ));
                None
            }
        };
        let config = config_text
            .as_deref()
            .and_then(|t| match t.parse::<toml::Table>() {
                Ok(c) => Some(c),
                Err(e) => {
                    let msg = e.to_string().replace('\n', " ");
                    warnings.push(format!("{}: {}", path.display(), msg.trim()));
                    None
                }
            });
        let dir_name = run_dir
            .canonicalize()
            .unwrap_or_else(|_| run_dir.to_path_buf())
            .file_name()
            .map_or_else(
                || run_dir.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            );
        let mut info = RunInfo {
            run_dir: run_dir.to_path_buf(),
            name: dir_name,
            config_text,
            config,
        };
        if let Some(name) = info.get("run", "name").and_then(toml::Value::as_str) {
            info.name = name.to_string();
        }
        info
    }

    /// `[section] key` of the config.
    pub fn get(&self, section: &str, key: &str) -> Option<&toml::Value> {
        self.config.as_ref()?.get(section)?.get(key)
    }

    /// `[section] key` as text for the summary ("?" when absent).
    fn show(&self, section: &str, key: &str) -> String {
        match self.get(section, key) {
            Some(toml::Value::String(s)) => s.clone(),
            Some(v) => v.to_string(),
            None => "?".into(),
        }
    }

    /// [`RunInfo::show`] of each (section, key).
    fn show_all<const N: usize>(&self, keys: [(&str, &str); N]) -> [String; N] {
        keys.map(|(section, key)| self.show(section, key))
    }

    /// Trajectories per group (`rollout.trajectories`).
    pub fn trajectories_per_group(&self) -> Option<u64> {
        self.get("rollout", "trajectories")?
            .as_integer()
            .and_then(|n| u64::try_from(n).ok())
    }
}

/// A number as the summary prints it.
fn num(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.3}"))
}

fn steps_span(log: &MetricsLog, range: std::ops::Range<usize>) -> String {
    let (a, b) = (log.steps[range.start].step, log.steps[range.end - 1].step);
    if a == b {
        format!("step {a}")
    } else {
        format!("steps {a}-{b}")
    }
}

/// Per hour over `wall_s`, as text.
fn per_hour(count: f64, wall_s: f64) -> String {
    if wall_s > 0.0 {
        format!("{:.0}", count * 3600.0 / wall_s)
    } else {
        "-".into()
    }
}

/// One series' means over the first and the last window of steps.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct WindowMeans {
    /// The series, as the summary labels it ("busy: Generator", "staleness: mean", ...).
    pub series: String,
    /// Mean over the first window (`None`: not recorded there).
    pub first: Option<f64>,
    /// Mean over the last window (`None`: not recorded there).
    pub last: Option<f64>,
}

/// The first and last window means of every series of `charts` (over `n` steps), in chart and
/// line order, spreads after their line. `window` must be in `1..=n`.
pub fn window_means(charts: &[Chart], n: usize, window: usize) -> Vec<WindowMeans> {
    let (first, tail) = (0..window, n - window..n);
    let mut out = Vec::new();
    for chart in charts {
        for line in &chart.lines {
            for s in std::iter::once(&line.series).chain(line.spread.as_ref()) {
                let series = match chart.file {
                    "utilisation.png" => format!("busy: {}", s.label),
                    "staleness.png" => format!("staleness: {}", s.label),
                    _ => s.label.clone(),
                };
                out.push(WindowMeans {
                    series,
                    first: s.mean(first.clone()),
                    last: s.mean(tail.clone()),
                });
            }
        }
    }
    out
}

/// The summary's markdown. `window` must be in `1..=log.steps.len()`.
pub fn markdown(
    info: &RunInfo,
    log: &MetricsLog,
    charts: &[Chart],
    window: usize,
    warnings: &[String],
) -> String {
    let n = log.steps.len();
    let last = log.steps.last().expect("a report has at least one step");
    let mut md = String::new();
    let _ = writeln!(md, "# Run report: {}\n", info.name);
    let _ = writeln!(
        md,
        "Run directory `{}`, written by `kevin report` from `{}`. Plots are over learner steps.\n",
        info.run_dir.display(),
        super::METRICS_FILE
    );

    md.push_str("## Run\n\n| | |\n| --- | --- |\n");
    let mut row = |k: &str, v: String| {
        let _ = writeln!(md, "| {k} | {v} |");
    };
    row("run", info.name.clone());
    if info.config.is_some() {
        row("mode", info.show("run", "mode"));
        let [policy, learner, env] =
            info.show_all([("policy", "kind"), ("learner", "kind"), ("env", "kind")]);
        row(
            "policy / learner / environment",
            format!("{policy} / {learner} / {env}"),
        );
        let [m, turns, tasks, staleness] = info.show_all([
            ("rollout", "trajectories"),
            ("rollout", "turns"),
            ("replay", "tasks_per_batch"),
            ("replay", "max_staleness"),
        ]);
        row(
            "rollout",
            format!(
                "{m} trajectories x {turns} turns per group, {tasks} tasks per batch, max \
                 staleness {staleness}"
            ),
        );
        let [compile, verify, profile] = info.show_all([
            ("env", "compile_workers"),
            ("env", "verify_workers"),
            ("env", "profile_workers"),
        ]);
        row(
            "evaluation workers",
            format!("compile {compile}, verify {verify}, profile {profile}"),
        );
    }
    row("learner steps", format!("{n} ({})", steps_span(log, 0..n)));
    row("daemon sessions", log.sessions.to_string());
    row(
        "wall time",
        format!(
            "{:.1} s ({:.2} h), each session up to its last step",
            log.wall_s,
            log.wall_s / 3600.0
        ),
    );
    let trained_groups: u64 = log.steps.iter().map(|m| m.groups).sum();
    let hourly = match info.trajectories_per_group() {
        Some(m) => format!(
            "{} generated ({} groups accepted x {m}), {} trained ({} groups x {m})",
            per_hour((last.accepted_total * m) as f64, log.wall_s),
            last.accepted_total,
            per_hour((trained_groups * m) as f64, log.wall_s),
            trained_groups
        ),
        None => format!(
            "unknown (no rollout.trajectories in the config); groups/hour: {} accepted, {} trained",
            per_hour(last.accepted_total as f64, log.wall_s),
            per_hour(trained_groups as f64, log.wall_s)
        ),
    };
    row("trajectories/hour", hourly);
    row("groups dropped as stale", last.dropped_total.to_string());
    row(
        super::METRICS_FILE,
        format!(
            "{} unreadable line(s) skipped, {} redone step record(s) replaced",
            log.skipped.len(),
            log.redone
        ),
    );

    let first = 0..window;
    let tail = n - window..n;
    let _ = writeln!(
        md,
        "\n## First vs last window\n\nMeans over the first and the last {window} step(s); a step \
         that did not record a series is left out of its mean.\n"
    );
    let _ = writeln!(
        md,
        "| series | first ({}) | last ({}) | change |\n| --- | ---: | ---: | ---: |",
        steps_span(log, first.clone()),
        steps_span(log, tail.clone())
    );
    for m in window_means(charts, n, window) {
        let change = match (m.first, m.last) {
            (Some(a), Some(b)) => format!("{:+.3}", b - a),
            _ => "-".into(),
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {change} |",
            m.series,
            num(m.first),
            num(m.last)
        );
    }

    md.push_str("\n## Plots\n\n");
    for chart in charts {
        if chart.is_empty() {
            let _ = writeln!(md, "- {}: not recorded, no plot\n", chart.what);
        } else {
            let _ = writeln!(md, "![{}]({})\n", chart.title, chart.file);
        }
    }
    md.push_str(
        "Busy fractions are an actor's summed span time over wall time since the previous step, \
         from the trace (`telemetry.trace`); a message still being handled counts up to the step \
         (runs recorded before 2026-12-06 late counted a message whole in the step it ended in, so \
         a single actor could show more than 1); an actor that serves requests in parallel (a \
         worker pool) can exceed 1.\n",
    );

    if !warnings.is_empty() {
        md.push_str("\n## Warnings\n\n");
        for w in warnings.iter().take(WARNINGS_LISTED) {
            let _ = writeln!(md, "- {w}");
        }
        if warnings.len() > WARNINGS_LISTED {
            let _ = writeln!(md, "- ... and {} more", warnings.len() - WARNINGS_LISTED);
        }
    }
    if let Some(text) = &info.config_text {
        let _ = writeln!(md, "\n## Config\n\n```toml\n{}\n```", text.trim_end());
    }
    md
}
