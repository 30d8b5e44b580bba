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
//! Several run directories (`kevin report RUN_A RUN_B ...`, or a sweep's folder, whose
//! `sweep.json` names its runs) are compared instead ([`compare`]): the same plots with one line
//! per run, labelled by the config keys in which the runs differ, and a summary table of those
//! settings and each run's first and last window figures.
//!
//! Dependency direction: `metrics_log` (the reader) imports nothing of the report's; `series`,
//! `plot`, `png`, `summary`, `write` and `compare` build on it; nothing here imports
//! `crate::pipeline` or another command, so `bench modes` can reuse the reader.

pub mod compare;
pub mod metrics_log;
pub mod plot;
pub mod png;
pub mod series;
pub mod summary;
pub mod write;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

pub use compare::{write_comparison, CompareOptions, Comparison};
pub use metrics_log::{MetricsLog, SkippedLine};
pub use series::{Chart, Line, Series};
pub use summary::RunInfo;
pub use write::{read_run, write_report, Report, ReportOptions, RunRead};

use super::{failure, usage, write_json, CmdResult};

/// PNG plots over learner steps (reward, correctness, mean speedup, staleness, actor
/// utilisation) and summary.md (config, steps, wall time, trajectories/hour, first vs last
/// window means) from a run directory's metrics.jsonl; several runs side by side when several
/// are given. Unreadable lines are skipped and named; run directories are only read, so live
/// runs can be reported on.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The run directory (the one `kevin train` wrote, with metrics.jsonl); several, or a
    /// sweep's folder (`kevin sweep --dir`), are compared.
    #[arg(required = true, value_name = "RUN_DIR")]
    pub run_dirs: Vec<PathBuf>,
    /// Output folder for the PNGs and summary.md (default: RUN_DIR/report for one run; for
    /// several, the sweep's folder's report/, or report/ in the folder the runs share).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Steps in each of the first and last windows the summary compares (default: a fifth of
    /// the steps, 1 to 50; per run when several).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub window: Option<u64>,
    /// Also write the figures (steps, window, first and last window means of every series,
    /// plots, warnings; with several runs, per run, with the differing settings) as JSON to
    /// this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// The manifest `kevin sweep` writes in its folder. Read here as plain JSON (its
/// `variants[].name`, each a run directory inside the folder), so the two commands share a file
/// format and no code.
pub const SWEEP_MANIFEST: &str = "sweep.json";

/// The run directories a report covers.
struct Runs {
    /// The run directories, in order.
    dirs: Vec<PathBuf>,
    /// The sweep folder they came from, when one was given.
    sweep: Option<PathBuf>,
    /// Variants of a sweep left out, and why.
    notes: Vec<String>,
}

/// `args`' run directories, a sweep's folder (a folder with sweep.json and no metrics.jsonl)
/// standing for its variants that have recorded a learner step.
fn runs_of(args: &[PathBuf]) -> Result<Runs, String> {
    let mut runs = Runs {
        dirs: Vec::new(),
        sweep: None,
        notes: Vec::new(),
    };
    for dir in args {
        let manifest = dir.join(SWEEP_MANIFEST);
        if !manifest.is_file() || dir.join(METRICS_FILE).exists() {
            runs.dirs.push(dir.clone());
            continue;
        }
        let text = std::fs::read_to_string(&manifest)
            .map_err(|e| format!("cannot read {}: {e}", manifest.display()))?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", manifest.display()))?;
        let names: Vec<&str> = json["variants"]
            .as_array()
            .map(|v| v.iter().filter_map(|v| v["name"].as_str()).collect())
            .unwrap_or_default();
        let before = runs.dirs.len();
        for name in names {
            let run = dir.join(name);
            if run.join(METRICS_FILE).is_file() {
                runs.dirs.push(run);
            } else {
                runs.notes.push(format!(
                    "{}: variant {name} has no learner step yet (no {}); left out",
                    manifest.display(),
                    run.join(METRICS_FILE).display()
                ));
            }
        }
        if runs.dirs.len() == before {
            return Err(format!(
                "{}: no variant of the sweep has recorded a learner step yet",
                manifest.display()
            ));
        }
        runs.sweep = Some(dir.clone());
    }
    if args.len() > 1 {
        runs.sweep = None;
    }
    Ok(runs)
}

/// The comparison's output folder when `--out` is not given: the sweep's `report/`, else
/// `report/` in the folder every run is in.
fn default_comparison_out(runs: &Runs) -> Result<PathBuf, String> {
    if let Some(sweep) = &runs.sweep {
        return Ok(sweep.join(DEFAULT_OUT));
    }
    let parent = |d: &Path| {
        d.canonicalize()
            .ok()
            .and_then(|c| c.parent().map(Path::to_path_buf))
    };
    let first = parent(&runs.dirs[0]);
    match first {
        Some(p) if runs.dirs.iter().all(|d| parent(d).as_ref() == Some(&p)) => {
            Ok(p.join(DEFAULT_OUT))
        }
        _ => Err(
            "the runs are in different folders: name the comparison's output folder with --out"
                .into(),
        ),
    }
}

/// Prints a report's warnings on stderr, the first [`REPORT_WARNINGS_SHOWN`], then where the
/// rest are.
fn print_warnings(warnings: &[String], summary: &Path) {
    if warnings.is_empty() {
        return;
    }
    eprintln!("kevin report: {} warning(s):", warnings.len());
    for w in warnings.iter().take(REPORT_WARNINGS_SHOWN) {
        eprintln!("  {w}");
    }
    if warnings.len() > REPORT_WARNINGS_SHOWN {
        eprintln!(
            "  ... and {} more (listed in {})",
            warnings.len() - REPORT_WARNINGS_SHOWN,
            summary.display()
        );
    }
}

/// Warnings `kevin report` prints on stderr before pointing at summary.md for the rest.
const REPORT_WARNINGS_SHOWN: usize = 10;

/// Writes the report (one run) or the comparison (several) and lists what it wrote.
pub fn run(args: Args) -> CmdResult {
    let window = args
        .window
        .map(|w| usize::try_from(w).unwrap_or(usize::MAX));
    let runs = runs_of(&args.run_dirs).map_err(failure)?;
    if runs.dirs.len() > 1 {
        let out = match args.out {
            Some(out) => out,
            None => default_comparison_out(&runs).map_err(usage)?,
        };
        let opts = CompareOptions {
            out,
            window,
            warnings: runs.notes,
        };
        let c = write_comparison(&runs.dirs, &opts).map_err(failure)?;
        print_warnings(&c.warnings, &c.summary);
        println!(
            "kevin report: {} runs{}, {} plots in {}",
            c.runs.len(),
            if c.differing_keys.is_empty() {
                String::new()
            } else {
                format!(" differing in {}", c.differing_keys.join(", "))
            },
            c.plots.len(),
            c.out.display()
        );
        for p in c.plots.iter().chain([&c.summary]) {
            println!("{}", p.display());
        }
        if let Some(path) = &args.json {
            write_json(path, &c).map_err(failure)?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let run_dir = &runs.dirs[0];
    let opts = ReportOptions {
        out: args
            .out
            .or_else(|| runs.sweep.as_ref().map(|s| s.join(DEFAULT_OUT))),
        window,
    };
    let mut r = write_report(run_dir, &opts).map_err(failure)?;
    r.warnings.splice(0..0, runs.notes);
    print_warnings(&r.warnings, &r.summary);
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
            "run_dir": run_dir.display().to_string(),
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
