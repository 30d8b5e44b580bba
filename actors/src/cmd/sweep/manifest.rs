//! `sweep.json` in the sweep's folder: the base config, the sets, and every variant with its run
//! directory and status, rewritten (atomically) whenever a status changes, so a script or
//! `kevin report SWEEP_DIR` can read where the sweep is. Whether a variant finished is never
//! taken from here: [`progress`] asks its run directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::plan::{SetArg, Variant};

/// The manifest's file name in the sweep's folder (`kevin report` reads its `variants[].dir`).
pub const MANIFEST_FILE: &str = "sweep.json";
/// Each variant's log (the `kevin train` child's stdout and stderr, appended session by session).
pub const LOG_FILE: &str = "train.log";

/// Where a variant is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Not started in this session (yet).
    Pending,
    /// Its `kevin train` child is running.
    Running,
    /// Its learner reached `run.max_steps` (its newest complete checkpoint says so).
    Finished,
    /// Stopped before `run.max_steps` (a signal); the next sweep resumes it.
    Stopped,
    /// Its child failed (the exit code and the log say why); the next sweep tries again.
    Failed,
}

impl Status {
    /// The word the sweep's table prints.
    pub fn word(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Running => "running",
            Status::Finished => "finished",
            Status::Stopped => "stopped",
            Status::Failed => "failed",
        }
    }
}

/// One variant's line of the manifest.
#[derive(Clone, Debug, Serialize)]
pub struct VariantRecord {
    /// The variant's name (its run directory's and its `run.name`).
    pub name: String,
    /// Its run directory.
    pub dir: PathBuf,
    /// Its overrides, key to value as given.
    pub overrides: BTreeMap<String, String>,
    /// `run.max_steps` of its config: the learner version at which it is finished.
    pub max_steps: u64,
    /// Where it is.
    pub status: Status,
    /// The learner version of its newest complete checkpoint (None: none yet).
    pub version: Option<u64>,
    /// The exit code of its last child in this session (None: not run, or ended by a signal).
    pub exit_code: Option<i32>,
    /// What went wrong or what the sweep did, in a line (a failure's cause, "skipped: ...").
    pub note: Option<String>,
    /// The child's log.
    pub log: PathBuf,
}

impl VariantRecord {
    /// The record of `v` as its run directory has it now: finished, or pending.
    pub fn new(v: &Variant) -> VariantRecord {
        let p = progress(&v.dir, v.config.run.max_steps);
        VariantRecord {
            name: v.name.clone(),
            dir: v.dir.clone(),
            overrides: v.overrides.iter().cloned().collect(),
            max_steps: v.config.run.max_steps,
            status: if p.finished {
                Status::Finished
            } else {
                Status::Pending
            },
            version: p.version,
            exit_code: None,
            note: p
                .finished
                .then(|| "finished before this session: skipped".to_string()),
            log: v.dir.join(LOG_FILE),
        }
    }
}

/// The whole manifest.
#[derive(Clone, Debug, Serialize)]
pub struct Manifest {
    /// The base config file, as given.
    pub config: PathBuf,
    /// The `--set`s, in order.
    pub sets: Vec<SetArg>,
    /// "product" or "zip".
    pub combine: &'static str,
    /// Children trained at once.
    pub parallel: usize,
    /// Every variant, in launch order.
    pub variants: Vec<VariantRecord>,
    /// Unix time of this write (seconds).
    pub updated_unix: u64,
}

impl Manifest {
    /// Writes the manifest to `dir/sweep.json` through a temporary file and a rename, so a
    /// reader never sees half of it.
    pub fn write(&mut self, dir: &Path) -> Result<(), String> {
        self.updated_unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let path = dir.join(MANIFEST_FILE);
        let text = serde_json::to_string_pretty(self).map_err(|e| e.to_string())? + "\n";
        kevin::run_dir::write_atomic(&path, text.as_bytes()).map_err(|e| e.to_string())
    }
}

/// How far a run directory is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    /// The learner version of the newest complete checkpoint (None: none, or no directory).
    pub version: Option<u64>,
    /// Whether that version reached `max_steps`.
    pub finished: bool,
}

/// How far the run in `dir` is, from the run directory itself: its newest checkpoint whose
/// manifest checks out (a run that reached `run.max_steps` always writes one there, and a run
/// stopped by a signal writes one at the version it stopped at). Read without the run's lock, so
/// a live run can be asked.
pub fn progress(dir: &Path, max_steps: u64) -> Progress {
    let version = kevin::run_dir::latest_checkpoint_of(dir)
        .newest
        .map(|(_, state)| state.learner_version);
    Progress {
        version,
        finished: max_steps > 0 && version.is_some_and(|v| v >= max_steps),
    }
}
