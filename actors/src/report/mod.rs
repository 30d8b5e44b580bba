//! `kevin report RUN_DIR`: PNG plots and a markdown summary of a training run.
//!
//! Everything comes from the run directory's `metrics.jsonl` (one [`StepMetrics`] line per learner
//! step) and its resolved `config.toml`: reward (mean, and the batch's spread where recorded),
//! correctness rate, mean speedup of the correct turns, staleness of the trained groups (mean and
//! max policy lag), and each actor's busy fraction, all over learner steps; then `summary.md` with
//! the run's name, config, steps, wall time, trajectories per hour, and the first and last window
//! means of every series.
//!
//! The report is for a researcher looking at a run, possibly one still going or one killed
//! mid-write: a line that does not parse is skipped and named (file and line), never fatal; only
//! a run with no readable step at all is an error. The run directory is only read (its lock is
//! not taken), so a live run can be reported on.
//!
//! [`MetricsLog`] reads the file, [`series`] turns it into the plotted series, [`plot`] draws them
//! (plotters, into a buffer, encoded by `png`), [`summary`] writes the markdown.

pub mod plot;
pub mod png;
pub mod series;
pub mod summary;

use std::path::{Path, PathBuf};

use kevin::metrics::StepMetrics;

pub use series::{Chart, Line, Series};
pub use summary::RunInfo;

/// The metrics file in a run directory.
pub const METRICS_FILE: &str = "metrics.jsonl";
/// The resolved config in a run directory.
pub const CONFIG_FILE: &str = "config.toml";
/// The summary's name in the output folder.
pub const SUMMARY_FILE: &str = "summary.md";
/// The output folder inside the run directory when `--out` is not given.
pub const DEFAULT_OUT: &str = "report";
/// Two records belong to one daemon session when their session start times (`unix_s -
/// elapsed_s`) differ by less than this many seconds (clock reads jitter by microseconds).
const SESSION_START_SLACK_S: f64 = 1.0;

/// Why a report could not be made. Each names the file or folder at fault.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The run directory is not there.
    #[error("run directory {} does not exist", .0.display())]
    NoRunDir(PathBuf),
    /// The run directory is a file.
    #[error("run directory {} is not a directory", .0.display())]
    NotADir(PathBuf),
    /// No metrics.jsonl: not a run directory, or no learner step finished yet.
    #[error("{} does not exist: not a kevin run directory, or the run has not finished a learner step yet", .0.display())]
    NoMetrics(PathBuf),
    /// metrics.jsonl holds no readable step.
    #[error("{}: no learner step recorded{}", path.display(), skipped_note(*skipped))]
    Empty {
        /// The metrics file.
        path: PathBuf,
        /// Lines that were there but could not be read.
        skipped: usize,
    },
    /// A file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A file or folder could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file or folder.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// plotters failed to draw a chart.
    #[error("cannot draw {}: {message}", path.display())]
    Draw {
        /// The PNG being drawn.
        path: PathBuf,
        /// plotters' message.
        message: String,
    },
}

fn skipped_note(skipped: usize) -> String {
    match skipped {
        0 => String::new(),
        n => format!(
            " ({n} unreadable line{} skipped)",
            if n == 1 { "" } else { "s" }
        ),
    }
}

/// A line of metrics.jsonl that could not be read.
#[derive(Clone, Debug, PartialEq)]
pub struct SkippedLine {
    /// 1-based line number.
    pub line: usize,
    /// Why (serde's message).
    pub message: String,
}

/// The learner steps of a run, as metrics.jsonl records them.
#[derive(Clone, Debug)]
pub struct MetricsLog {
    /// The file read.
    pub path: PathBuf,
    /// One record per learner step, in step order. A step recorded twice (redone after a resume
    /// from an older checkpoint) keeps its last record: that is the one the run went on from.
    pub steps: Vec<StepMetrics>,
    /// Lines that could not be read (torn by a kill, or corrupt), in file order.
    pub skipped: Vec<SkippedLine>,
    /// Records replaced by a later record of the same step.
    pub redone: usize,
    /// Daemon sessions (a resumed run has several).
    pub sessions: usize,
    /// Wall-clock seconds of all sessions up to their last recorded step (time between sessions
    /// not counted).
    pub wall_s: f64,
}

impl MetricsLog {
    /// Reads `path`. Unreadable lines are skipped and listed; a file without any step is
    /// [`ReportError::Empty`].
    pub fn read(path: &Path) -> Result<MetricsLog, ReportError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ReportError::NoMetrics(path.to_path_buf()))
            }
            Err(source) => {
                return Err(ReportError::Read {
                    path: path.to_path_buf(),
                    source,
                })
            }
        };
        let log = MetricsLog::parse(path, &text);
        if log.steps.is_empty() {
            return Err(ReportError::Empty {
                path: path.to_path_buf(),
                skipped: log.skipped.len(),
            });
        }
        Ok(log)
    }

    /// Parses the text of a metrics file (`path` only names it). Blank lines are ignored.
    pub fn parse(path: &Path, text: &str) -> MetricsLog {
        let mut records = Vec::new();
        let mut skipped = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<StepMetrics>(line) {
                Ok(m) => records.push(m),
                Err(e) => skipped.push(SkippedLine {
                    line: i + 1,
                    message: e.to_string(),
                }),
            }
        }

        // Sessions in file order: within one, `unix_s - elapsed_s` (its start) is constant and
        // elapsed_s grows; a resumed session starts its clock again.
        let (mut sessions, mut wall_s) = (0, 0.0);
        let mut current: Option<(f64, f64)> = None; // (session start, last elapsed_s)
        for m in &records {
            let start = m.unix_s - m.elapsed_s;
            match current {
                Some((s, last))
                    if m.elapsed_s >= last && (start - s).abs() < SESSION_START_SLACK_S =>
                {
                    current = Some((s, m.elapsed_s));
                }
                _ => {
                    wall_s += current.map_or(0.0, |(_, last)| last);
                    sessions += 1;
                    current = Some((start, m.elapsed_s));
                }
            }
        }
        wall_s += current.map_or(0.0, |(_, last)| last);

        let total = records.len();
        let mut by_step = std::collections::BTreeMap::new();
        for m in records {
            by_step.insert(m.step, m);
        }
        MetricsLog {
            path: path.to_path_buf(),
            redone: total - by_step.len(),
            steps: by_step.into_values().collect(),
            skipped,
            sessions,
            wall_s,
        }
    }
}

/// What `kevin report` wrote.
#[derive(Clone, Debug)]
pub struct Report {
    /// The output folder.
    pub out: PathBuf,
    /// The PNG files, in summary order.
    pub plots: Vec<PathBuf>,
    /// The markdown summary.
    pub summary: PathBuf,
    /// Things the reader should know: skipped lines, series that were not recorded.
    pub warnings: Vec<String>,
    /// Learner steps reported.
    pub steps: usize,
}

/// Options of [`write_report`].
#[derive(Clone, Debug, Default)]
pub struct ReportOptions {
    /// Output folder; default `RUN_DIR/report`.
    pub out: Option<PathBuf>,
    /// Steps in each of the first and last windows the summary compares; default
    /// [`series::default_window`].
    pub window: Option<usize>,
}

/// Reads `run_dir` and writes the plots and `summary.md` (see the module docs).
pub fn write_report(run_dir: &Path, opts: &ReportOptions) -> Result<Report, ReportError> {
    match std::fs::metadata(run_dir) {
        Ok(md) if md.is_dir() => {}
        Ok(_) => return Err(ReportError::NotADir(run_dir.to_path_buf())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ReportError::NoRunDir(run_dir.to_path_buf()))
        }
        Err(source) => {
            return Err(ReportError::Read {
                path: run_dir.to_path_buf(),
                source,
            })
        }
    }
    let log = MetricsLog::read(&run_dir.join(METRICS_FILE))?;
    let mut warnings: Vec<String> = log
        .skipped
        .iter()
        .map(|s| {
            format!(
                "{} line {}: {} (skipped)",
                log.path.display(),
                s.line,
                s.message
            )
        })
        .collect();
    let info = RunInfo::read(run_dir, &mut warnings);

    let out = opts
        .out
        .clone()
        .unwrap_or_else(|| run_dir.join(DEFAULT_OUT));
    std::fs::create_dir_all(&out).map_err(|source| ReportError::Write {
        path: out.clone(),
        source,
    })?;

    let charts = series::charts(&log.steps);
    let mut plots = Vec::new();
    for chart in &charts {
        if chart.is_empty() {
            warnings.push(format!(
                "{}: {} not recorded at any step; {} not drawn",
                log.path.display(),
                chart.what,
                chart.file
            ));
            continue;
        }
        let path = out.join(chart.file);
        plot::draw_png(&path, chart)?;
        plots.push(path);
    }

    let window = opts
        .window
        .unwrap_or_else(|| series::default_window(log.steps.len()))
        .clamp(1, log.steps.len());
    let text = summary::markdown(&info, &log, &charts, window, &warnings);
    let summary = out.join(SUMMARY_FILE);
    std::fs::write(&summary, text).map_err(|source| ReportError::Write {
        path: summary.clone(),
        source,
    })?;
    Ok(Report {
        out,
        plots,
        summary,
        warnings,
        steps: log.steps.len(),
    })
}
