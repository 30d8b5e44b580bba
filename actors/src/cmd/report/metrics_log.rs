//! [`MetricsLog`]: a run's metrics.jsonl read leniently (unreadable lines skipped and named,
//! redone steps keeping their last record, daemon sessions and wall time counted).

use std::path::{Path, PathBuf};

use kevin::metrics::StepMetrics;

use super::ReportError;

/// Two records belong to one daemon session when their session start times (`unix_s -
/// elapsed_s`) differ by less than this many seconds (clock reads jitter by microseconds).
const SESSION_START_SLACK_S: f64 = 1.0;

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
        // The live file and its rotated, gzipped archives, oldest first.
        let text = match kevin::telemetry::files::read_rotated(path) {
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
