//! [`write_report`]: reads a run directory ([`read_run`], which the comparison of several runs
//! shares) and writes the plots and `summary.md`.

use std::path::{Path, PathBuf};

use super::{
    plot, series, summary, MetricsLog, ReportError, RunInfo, DEFAULT_OUT, METRICS_FILE,
    SUMMARY_FILE,
};

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
    /// Steps in each of the first and last windows the summary compares.
    pub window: usize,
    /// The first and last window means of every series, as the summary lists them.
    pub means: Vec<summary::WindowMeans>,
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

/// A run directory as the report reads it: its metrics, its config, and what the reader should
/// know (skipped lines, an unreadable config).
#[derive(Clone, Debug)]
pub struct RunRead {
    /// metrics.jsonl.
    pub log: MetricsLog,
    /// config.toml and the run's name.
    pub info: RunInfo,
    /// Skipped lines and config problems, each naming its file.
    pub warnings: Vec<String>,
}

/// Reads `run_dir`'s metrics.jsonl and config.toml (only reads; a live run can be read). A
/// missing directory, a missing metrics.jsonl or one without a readable step is an error naming
/// it; everything else becomes a warning.
pub fn read_run(run_dir: &Path) -> Result<RunRead, ReportError> {
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
    Ok(RunRead {
        log,
        info,
        warnings,
    })
}

/// Reads `run_dir` and writes the plots and `summary.md` (see the module docs).
pub fn write_report(run_dir: &Path, opts: &ReportOptions) -> Result<Report, ReportError> {
    let RunRead {
        log,
        info,
        mut warnings,
    } = read_run(run_dir)?;

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
    let means = summary::window_means(&charts, log.steps.len(), window);
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
        window,
        means,
    })
}
