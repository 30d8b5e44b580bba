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

//!
//! Dependency direction: `metrics_log` (the reader) imports nothing of the report's; `series`,
//! `plot`, `png`, `summary` and `write` build on it; nothing here imports `crate::pipeline` or
//! another command, so `bench modes` can reuse the reader.

pub mod metrics_log;
pub mod plot;
pub mod png;
pub mod series;
pub mod summary;
pub mod write;

use std::path::PathBuf;
use std::process::ExitCode;

pub use metrics_log::{MetricsLog, SkippedLine};
pub use series::{Chart, Line, Series};
pub use summary::RunInfo;
pub use write::{write_report, Report, ReportOptions};

use super::{failure, write_json, CmdResult};

/// PNG plots over learner steps (reward, correctness, mean speedup, staleness, actor
/// utilisation) and summary.md (config, steps, wall time, trajectories/hour, first vs last
/// window means) from a run directory's metrics.jsonl. Unreadable lines are skipped and
/// named; the run directory is only read, so a live run can be reported on.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The run directory (the one `kevin train` wrote, with metrics.jsonl).
    pub run_dir: PathBuf,
    /// Output folder for the PNGs and summary.md (default: RUN_DIR/report).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Steps in each of the first and last windows the summary compares (default: a fifth of
    /// the steps, 1 to 50).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub window: Option<u64>,
    /// Also write the figures (steps, window, first and last window means of every series,
    /// plots, warnings) as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Warnings `kevin report` prints on stderr before pointing at summary.md for the rest.
const REPORT_WARNINGS_SHOWN: usize = 10;

/// Writes the report and lists what it wrote.
pub fn run(args: Args) -> CmdResult {
    let opts = ReportOptions {
        out: args.out,
        window: args
            .window
            .map(|w| usize::try_from(w).unwrap_or(usize::MAX)),
    };
    let r = write_report(&args.run_dir, &opts).map_err(failure)?;
    if !r.warnings.is_empty() {
        eprintln!("kevin report: {} warning(s):", r.warnings.len());
        for w in r.warnings.iter().take(REPORT_WARNINGS_SHOWN) {
            eprintln!("  {w}");
        }
        if r.warnings.len() > REPORT_WARNINGS_SHOWN {
            eprintln!(
                "  ... and {} more (listed in {})",
                r.warnings.len() - REPORT_WARNINGS_SHOWN,
                r.summary.display()
            );
        }
    }
    println!(
        "kevin report: {} learner steps, {} plots in {}",
        r.steps,
        r.plots.len(),
        r.out.display()
    );
    for p in r.plots.iter().chain([&r.summary]) {
        println!("{}", p.display());
    }
    if let Some(path) = &args.json {
        let figures = serde_json::json!({
            "run_dir": args.run_dir.display().to_string(),
            "steps": r.steps,
            "window": r.window,
            "means": r.means,
            "plots": r.plots.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
            "summary": r.summary.display().to_string(),
            "warnings": r.warnings,
        });
        write_json(path, &figures).map_err(failure)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The metrics file in a run directory.
pub const METRICS_FILE: &str = "metrics.jsonl";
/// The resolved config in a run directory.
pub const CONFIG_FILE: &str = "config.toml";
/// The summary's name in the output folder.
pub const SUMMARY_FILE: &str = "summary.md";
/// The output folder inside the run directory when `--out` is not given.
pub const DEFAULT_OUT: &str = "report";

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
