//! `kevin report RUN_A RUN_B ...`: several runs side by side (a sweep's variants, or any runs).
//!
//! Each run is read as a single report reads it ([`read_run`]); the settings in which the runs
//! differ are found by diffing their resolved `config.toml` key by key (`run.name` and
//! `run.runs_dir` name a run rather than set it, so they are left out), and label the runs. The
//! plots are the single report's, one line per run in one colour across every plot: the reward
//! mean (without its band, which would hide the other runs), the correct rate, the mean speedup
//! of the correct turns, the mean policy lag, and one utilisation plot per pipeline actor
//! (`utilisation-generator.png`, ...). x is the learner step; a run without a value at a step
//! leaves a gap there. `summary.md` holds one table: a row per run, its differing settings, then
//! its figures and the means over its first and last window of steps.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::series::{self, Chart, Line, Series, PIPELINE_ACTORS};
use super::summary::{window_means, WindowMeans};
use super::{plot, read_run, ReportError, RunRead, SUMMARY_FILE};

/// Config keys that name a run rather than set it: never a difference between runs.
pub const NAMING_KEYS: [&str; 2] = ["run.name", "run.runs_dir"];
/// The single report's charts drawn per run, by index in [`series::charts`], with the y label
/// of their headline line (the first line of the chart).
const HEADLINE_CHARTS: [(usize, &str); 4] = [
    (0, "turn score (batch mean)"),
    (1, "fraction of turns correct"),
    (2, "speedup over the eager baseline"),
    (3, "mean policy lag (learner versions)"),
];
/// The utilisation plots of a comparison, one per pipeline actor: (actor, file, title).
const UTILISATION_CHARTS: [(&str, &str, &str); 5] = [
    (
        "Generator",
        "utilisation-generator.png",
        "Generator utilisation",
    ),
    (
        "Compiler",
        "utilisation-compiler.png",
        "Compiler utilisation",
    ),
    (
        "Verifier",
        "utilisation-verifier.png",
        "Verifier utilisation",
    ),
    (
        "Profiler",
        "utilisation-profiler.png",
        "Profiler utilisation",
    ),
    ("Learner", "utilisation-learner.png", "Learner utilisation"),
];
/// The window means the summary's table shows per run: (series, column).
const TABLE_SERIES: [(&str, &str); 4] = [
    ("reward mean", "reward"),
    ("correct rate", "correct rate"),
    ("mean speedup", "mean speedup"),
    ("staleness: mean lag", "mean lag"),
];

/// Options of [`write_comparison`].
#[derive(Clone, Debug)]
pub struct CompareOptions {
    /// Output folder.
    pub out: PathBuf,
    /// Steps in each of the first and last windows of every run; default
    /// [`series::default_window`] of each run's steps.
    pub window: Option<usize>,
    /// Warnings from before the runs were read (a sweep's variants left out), listed first.
    pub warnings: Vec<String>,
}

/// Trajectories per hour of wall-clock time (None: unknown trajectories per group, or no time).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PerHour {
    /// Generated: groups accepted x trajectories per group.
    pub generated: Option<f64>,
    /// Trained: groups trained x trajectories per group.
    pub trained: Option<f64>,
}

/// One run's line of the comparison.
#[derive(Clone, Debug, Serialize)]
pub struct RunFigures {
    /// The run directory, as given.
    pub run_dir: PathBuf,
    /// `run.name`, else the directory's name.
    pub name: String,
    /// The legend's label: its differing settings (`key=value, ...`), else its directory.
    pub label: String,
    /// Its value of each differing key (null where its config lacks the key or has none).
    pub settings: BTreeMap<String, serde_json::Value>,
    /// Learner steps.
    pub steps: usize,
    /// Steps in each of its first and last windows.
    pub window: usize,
    /// Daemon sessions.
    pub sessions: usize,
    /// Wall-clock seconds of its sessions.
    pub wall_s: f64,
    /// Trajectories per hour.
    pub trajectories_per_hour: PerHour,
    /// First and last window means of every series, as a single report lists them.
    pub means: Vec<WindowMeans>,
}

/// What a comparison wrote.
#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    /// The output folder.
    pub out: PathBuf,
    /// The keys in which the runs' configs differ, sorted.
    pub differing_keys: Vec<String>,
    /// One entry per run, in the order given.
    pub runs: Vec<RunFigures>,
    /// The PNG files, in summary order.
    pub plots: Vec<PathBuf>,
    /// The markdown summary.
    pub summary: PathBuf,
    /// What the reader should know, each naming its run's file.
    pub warnings: Vec<String>,
}

/// The keys whose values are not the same in every config (a key one config lacks differs),
/// without [`NAMING_KEYS`].
pub fn differing_keys(configs: &[BTreeMap<String, toml::Value>]) -> Vec<String> {
    let keys: BTreeSet<&String> = configs.iter().flat_map(|c| c.keys()).collect();
    keys.into_iter()
        .filter(|k| !NAMING_KEYS.contains(&k.as_str()))
        .filter(|k| configs.iter().any(|c| c.get(*k) != configs[0].get(*k)))
        .cloned()
        .collect()
}

/// A value as a label shows it: strings without quotes, ASCII only (the plots' font).
fn show(v: Option<&toml::Value>) -> String {
    let text = match v {
        Some(toml::Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
        None => "-".into(),
    };
    text.chars()
        .map(|c| {
            if c.is_ascii() && !c.is_control() {
                c
            } else {
                '?'
            }
        })
        .collect()
}

/// The last component of a path as given (its canonical form's, for `.` and `..`).
fn dir_name(dir: &Path) -> String {
    dir.canonicalize()
        .unwrap_or_else(|_| dir.to_path_buf())
        .file_name()
        .map_or_else(
            || dir.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        )
}

/// A series of `steps` spread over the union of steps `xs` (None where the run has no step).
fn aligned(xs: &[u64], steps: &[u64], s: &Series, label: &str) -> Series {
    let at: BTreeMap<u64, Option<f64>> = steps.iter().copied().zip(s.values.clone()).collect();
    Series {
        label: label.to_string(),
        values: xs.iter().map(|x| at.get(x).copied().flatten()).collect(),
    }
}

/// The comparison's charts: per headline chart and per pipeline actor, one line per run (in the
/// order of `runs`, so run i has colour i everywhere).
fn charts(runs: &[RunRead], labels: &[String]) -> Vec<Chart> {
    let xs: Vec<u64> = runs
        .iter()
        .flat_map(|r| r.log.steps.iter().map(|m| m.step))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let singles: Vec<Vec<Chart>> = runs.iter().map(|r| series::charts(&r.log.steps)).collect();
    let line = |series| Line {
        series,
        spread: None,
    };
    let mut out = Vec::new();
    for (index, y_label) in HEADLINE_CHARTS {
        let first = &singles[0][index];
        out.push(Chart {
            file: first.file,
            title: first.title,
            what: first.what,
            y_label,
            steps: xs.clone(),
            lines: singles
                .iter()
                .zip(labels)
                .map(|(c, label)| {
                    line(aligned(
                        &xs,
                        &c[index].steps,
                        &c[index].lines[0].series,
                        label,
                    ))
                })
                .collect(),
            y_at_least: first.y_at_least,
        });
    }
    for (actor, file, title) in UTILISATION_CHARTS {
        debug_assert!(PIPELINE_ACTORS.contains(&actor));
        let lines: Vec<Line> = runs
            .iter()
            .zip(labels)
            .map(|(r, label)| {
                let steps: Vec<u64> = r.log.steps.iter().map(|m| m.step).collect();
                let s = Series {
                    label: label.clone(),
                    values: r
                        .log
                        .steps
                        .iter()
                        .map(|m| m.busy.get(actor).copied())
                        .collect(),
                };
                line(aligned(&xs, &steps, &s, label))
            })
            .collect();
        out.push(Chart {
            file,
            title,
            what: title,
            y_label: "busy time / wall time (>1: a pool busy in parallel)",
            steps: xs.clone(),
            lines,
            y_at_least: 1.0,
        });
    }
    out
}

/// Per hour over `wall_s`.
fn per_hour(count: Option<u64>, wall_s: f64) -> Option<f64> {
    count
        .filter(|_| wall_s > 0.0)
        .map(|c| c as f64 * 3600.0 / wall_s)
}

/// Reads every run of `run_dirs` and writes the comparison's plots and `summary.md` to
/// `opts.out` (see the module docs). Any run that cannot be read at all is an error naming it.
pub fn write_comparison(
    run_dirs: &[PathBuf],
    opts: &CompareOptions,
) -> Result<Comparison, ReportError> {
    let runs: Vec<RunRead> = run_dirs
        .iter()
        .map(|d| read_run(d))
        .collect::<Result<_, _>>()?;
    let mut warnings = opts.warnings.clone();
    warnings.extend(runs.iter().flat_map(|r| r.warnings.clone()));
    // Runs without a readable config are left out of the diff (they would differ in every key).
    let flat: Vec<Option<BTreeMap<String, toml::Value>>> = runs
        .iter()
        .map(|r| r.info.config.as_ref().map(kevin::config::flatten))
        .collect();
    let known: Vec<BTreeMap<String, toml::Value>> = flat.iter().flatten().cloned().collect();
    let keys = differing_keys(&known);
    let mut labels: Vec<String> = runs
        .iter()
        .zip(&flat)
        .zip(run_dirs)
        .map(|((_, cfg), dir)| match cfg {
            Some(c) if !keys.is_empty() => keys
                .iter()
                .map(|k| format!("{k}={}", show(c.get(k))))
                .collect::<Vec<_>>()
                .join(", "),
            _ => show(Some(&toml::Value::String(dir_name(dir)))),
        })
        .collect();
    // Runs whose labels clash (the same settings, or the same folder name) are told apart by
    // their paths.
    let clashing: Vec<bool> = labels
        .iter()
        .map(|l| labels.iter().filter(|o| *o == l).count() > 1)
        .collect();
    for ((label, clash), dir) in labels.iter_mut().zip(clashing).zip(run_dirs) {
        if clash {
            *label = format!(
                "{label} ({})",
                show(Some(&toml::Value::String(dir.display().to_string())))
            );
        }
    }
    if runs.len() > plot::LINE_COLOURS {
        warnings.push(format!(
            "{} runs and {} line colours: runs {} and on reuse the colours of the first",
            runs.len(),
            plot::LINE_COLOURS,
            plot::LINE_COLOURS + 1
        ));
    }

    std::fs::create_dir_all(&opts.out).map_err(|source| ReportError::Write {
        path: opts.out.clone(),
        source,
    })?;
    let charts = charts(&runs, &labels);
    let mut plots = Vec::new();
    let mut drawn = Vec::new();
    for chart in &charts {
        if chart.is_empty() {
            continue;
        }
        let path = opts.out.join(chart.file);
        plot::draw_png(&path, chart)?;
        plots.push(path);
        drawn.push(chart);
    }
    for chart in charts.iter().take(HEADLINE_CHARTS.len()) {
        if chart.is_empty() {
            warnings.push(format!(
                "{} not recorded at any step of any run; {} not drawn",
                chart.what, chart.file
            ));
        }
    }

    let figures: Vec<RunFigures> = runs
        .iter()
        .zip(&flat)
        .zip(run_dirs)
        .zip(&labels)
        .map(|(((r, cfg), dir), label)| {
            let n = r.log.steps.len();
            let window = opts
                .window
                .unwrap_or_else(|| series::default_window(n))
                .clamp(1, n);
            let m = r.info.trajectories_per_group();
            let trained: u64 = r.log.steps.iter().map(|s| s.groups).sum();
            let accepted = r.log.steps.last().map_or(0, |s| s.accepted_total);
            RunFigures {
                run_dir: dir.clone(),
                name: r.info.name.clone(),
                label: label.clone(),
                settings: keys
                    .iter()
                    .map(|k| {
                        let v = cfg.as_ref().and_then(|c| c.get(k));
                        let json = v
                            .and_then(|v| serde_json::to_value(v).ok())
                            .unwrap_or(serde_json::Value::Null);
                        (k.clone(), json)
                    })
                    .collect(),
                steps: n,
                window,
                sessions: r.log.sessions,
                wall_s: r.log.wall_s,
                trajectories_per_hour: PerHour {
                    generated: per_hour(m.map(|m| accepted * m), r.log.wall_s),
                    trained: per_hour(m.map(|m| trained * m), r.log.wall_s),
                },
                means: window_means(&series::charts(&r.log.steps), n, window),
            }
        })
        .collect();

    let summary = opts.out.join(SUMMARY_FILE);
    let text = markdown(&figures, &keys, &drawn, &warnings);
    std::fs::write(&summary, text).map_err(|source| ReportError::Write {
        path: summary.clone(),
        source,
    })?;
    Ok(Comparison {
        out: opts.out.clone(),
        differing_keys: keys,
        runs: figures,
        plots,
        summary,
        warnings,
    })
}

/// A number as the table prints it.
fn num(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.decimals$}"))
}

/// A setting as the table prints it.
fn setting(v: Option<&serde_json::Value>) -> String {
    match v {
        None | Some(serde_json::Value::Null) => "-".into(),
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
    }
}

/// The comparison's markdown: the runs' table, the plots, the warnings.
fn markdown(
    runs: &[RunFigures],
    keys: &[String],
    charts: &[&Chart],
    warnings: &[String],
) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# Comparison of {} runs\n", runs.len());
    let differ = if keys.is_empty() {
        "Their configs do not differ (runs are labelled by their folders).".to_string()
    } else {
        format!(
            "They differ in {}; every other key of their config.toml is the same (run.name and \
             run.runs_dir, which name a run, are not compared).",
            keys.iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let _ = writeln!(
        md,
        "Written by `kevin report` from each run's `{}` and `{}`. {differ} Plots are over learner \
         steps, one line per run.\n",
        super::METRICS_FILE,
        super::CONFIG_FILE
    );
    md.push_str(
        "## Runs\n\nFirst and last: the means over each run's first and last window of steps \
         (`window` steps each); a step that did not record a series is left out of its mean. \
         Trajectories per hour: generated (groups accepted) over the wall time of its \
         sessions.\n\n",
    );
    let mut header = vec!["run".to_string()];
    header.extend(keys.iter().cloned());
    header.extend(
        ["steps", "window", "wall time (s)", "trajectories/hour"]
            .iter()
            .map(|s| s.to_string()),
    );
    for (_, column) in TABLE_SERIES {
        header.push(format!("{column} first"));
        header.push(format!("{column} last"));
    }
    let _ = writeln!(md, "| {} |", header.join(" | "));
    // Settings may be words: left-aligned; figures right-aligned.
    let _ = writeln!(
        md,
        "| --- |{}{}",
        " --- |".repeat(keys.len()),
        " ---: |".repeat(header.len() - 1 - keys.len())
    );
    for r in runs {
        let mut row = vec![dir_name(&r.run_dir)];
        row.extend(keys.iter().map(|k| setting(r.settings.get(k))));
        row.push(r.steps.to_string());
        row.push(r.window.to_string());
        row.push(format!("{:.1}", r.wall_s));
        row.push(num(r.trajectories_per_hour.generated, 0));
        for (series, _) in TABLE_SERIES {
            let m = r.means.iter().find(|m| m.series == series);
            row.push(num(m.and_then(|m| m.first), 3));
            row.push(num(m.and_then(|m| m.last), 3));
        }
        let _ = writeln!(md, "| {} |", row.join(" | "));
    }
    md.push_str("\nRun directories:\n\n");
    for (i, r) in runs.iter().enumerate() {
        let _ = writeln!(
            md,
            "{}. `{}` ({}; {} session(s))",
            i + 1,
            r.run_dir.display(),
            r.label,
            r.sessions
        );
    }
    md.push_str("\n## Plots\n\n");
    for chart in charts {
        let _ = writeln!(md, "![{}]({})\n", chart.title, chart.file);
    }
    md.push_str(
        "Each run's own report (`kevin report RUN_DIR`) has the reward's spread, the max lag and \
         every actor's busy fraction.\n",
    );
    if !warnings.is_empty() {
        md.push_str("\n## Warnings\n\n");
        for w in warnings {
            let _ = writeln!(md, "- {w}");
        }
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> BTreeMap<String, toml::Value> {
        kevin::config::flatten(&text.parse::<toml::Table>().unwrap())
    }

    #[test]
    fn runs_differ_in_the_keys_whose_values_differ_but_not_in_their_names() {
        let a = config(
            "[run]\nname = \"a\"\nmode = \"async\"\n[learner]\nlr = 1e-4\n[env]\ngpus = [0]\n",
        );
        let b = config(
            "[run]\nname = \"b\"\nmode = \"async\"\n[learner]\nlr = 3e-4\n[env]\ngpus = [0, 1]\n",
        );
        let c = config(
            "[run]\nname = \"c\"\nmode = \"async\"\n[learner]\nlr = 1e-4\n[env]\ngpus = [0]\n\
             kind = \"cpu\"\n",
        );
        assert_eq!(
            differing_keys(&[a.clone(), b.clone()]),
            ["env.gpus", "learner.lr"]
        );
        assert_eq!(differing_keys(&[a.clone(), c]), ["env.kind"]);
        assert!(differing_keys(&[a.clone(), a.clone()]).is_empty());
        assert_eq!(show(a.get("run.mode")), "async");
        assert_eq!(show(b.get("env.gpus")), "[0, 1]");
        assert_eq!(show(None), "-");
    }
}
