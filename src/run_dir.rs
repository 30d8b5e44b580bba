//! The run directory: what a run writes, and how a restarted run finds where it stopped.
//!
//! Layout of `runs/<name>/`:
//! - `config.toml`: the resolved configuration;
//! - `wal/`: the write-ahead log of accepted groups, in segments deleted once a checkpoint covers
//!   their training (see [`crate::wal`]);
//! - `learner.jsonl`: the learner's record, one line per step: the version it produced and the
//!   sequence numbers of the groups it trained on and dropped as stale; lines that recovery can
//!   no longer need (a checkpoint covers them and every group they name is in a deleted WAL
//!   segment) move to `learner.NNNNNN.jsonl.gz` in batches ([`read_all_steps`] reads both);
//! - `checkpoints/step-<version>/`: learner state, `state.json` (sampler, counters, pending
//!   replay) and `COMPLETE`, a manifest of sizes and hashes written last;
//! - `metrics.jsonl`, `episodes.jsonl`, `trace-<session>.json`, `best/<task>.cu`;
//! - `kevin.lock`: the pid of the daemon that owns the directory.
//!
//! Recovery: the newest checkpoint whose manifest checks out gives version V (a checkpoint that
//! was being written when the process died has no valid manifest and is skipped). Record lines
//! past V are cut (those steps are redone, so no group counts as trained twice), and every group
//! in the WAL that no remaining record line consumed goes back into the replay queue (so no
//! accepted group is lost). The WAL's segments whose groups the remaining lines all consumed are
//! then deleted, as after every checkpoint ([`RunDir::compact_wal`]), so a restart reads only
//! what is still pending and its time does not grow with the run's length.

use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::ConfigFile;
use crate::learner::{Learner, TrainStats};
use crate::replay::{ReplayError, ScoredGroup};
use crate::sampler::SamplerState;
use crate::telemetry::files;
use crate::wal::{self, Compaction, Wal};

/// Checkpoints kept on disk; older ones are deleted after a new one is complete.
pub const KEEP_CHECKPOINTS: usize = 3;

/// A failure of the run directory.
#[derive(Debug, thiserror::Error)]
pub enum RunDirError {
    /// A file or folder could not be read or written.
    #[error("{path}: {reason}")]
    Io {
        /// The path.
        path: String,
        /// Why.
        reason: String,
    },
    /// Another live process owns the run directory.
    #[error("run directory {dir} is in use by process {pid} (remove {dir}/kevin.lock if that process is gone)")]
    Locked {
        /// The run directory.
        dir: String,
        /// The owner.
        pid: u32,
    },
    /// The write-ahead log failed.
    #[error(transparent)]
    Replay(#[from] ReplayError),
    /// A learner failed to save or load.
    #[error(transparent)]
    Learner(#[from] crate::learner::LearnerError),
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> RunDirError + '_ {
    move |e| RunDirError::Io {
        path: path.display().to_string(),
        reason: e.to_string(),
    }
}

/// One line of the learner's record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// The learner version this step produced.
    pub version: u64,
    /// Groups trained on.
    pub trained: Vec<u64>,
    /// Groups dropped as stale before this step.
    pub dropped: Vec<u64>,
    /// What the step measured.
    pub stats: TrainStats,
}

/// Counters that live across restarts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Counters {
    /// Groups accepted by the replay queue.
    pub groups_accepted: u64,
    /// Groups dropped as stale.
    pub groups_dropped: u64,
    /// Groups trained on.
    pub groups_trained: u64,
    /// Turns generated and evaluated.
    pub turns: u64,
}

/// `state.json` of a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointState {
    /// Learner version.
    pub learner_version: u64,
    /// The task sampler's state.
    pub sampler: Option<SamplerState>,
    /// Sequence numbers waiting in the replay queue when the checkpoint was written (informative:
    /// recovery derives the pending set from the WAL and the learner's record).
    pub replay_pending: Vec<u64>,
    /// Counters.
    pub counters: Counters,
    /// Unix time of writing (seconds).
    pub written_unix: u64,
}

/// What a restarted run starts from.
#[derive(Debug)]
pub struct Recovery {
    /// Path and state of the checkpoint resumed from, if any.
    pub checkpoint: Option<(PathBuf, CheckpointState)>,
    /// Checkpoint folders skipped because they were incomplete or corrupt, after being renamed
    /// to `torn-<name>-<pid>`.
    pub skipped: Vec<PathBuf>,
    /// Accepted groups not yet consumed, oldest first.
    pub pending: Vec<ScoredGroup>,
    /// The next acceptance sequence number.
    pub next_seq: u64,
    /// The open write-ahead log.
    pub wal: Wal,
    /// Record lines cut because they came after the checkpoint.
    pub record_lines_cut: usize,
    /// WAL records read to find the pending ones (what recovery cost).
    pub wal_records_read: usize,
    /// WAL segments deleted because the checkpoint covers them.
    pub wal_compaction: Compaction,
}

/// An open run directory, locked by this process until dropped.
#[derive(Debug)]
pub struct RunDir {
    root: PathBuf,
}

fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

impl RunDir {
    /// Opens (creating) the run directory and takes its lock.
    pub fn open(root: &Path) -> Result<RunDir, RunDirError> {
        fs::create_dir_all(root.join("checkpoints")).map_err(io_err(root))?;
        let lock = root.join("kevin.lock");
        if let Ok(text) = fs::read_to_string(&lock) {
            if let Ok(pid) = text.trim().parse::<u32>() {
                if pid != std::process::id() && pid_alive(pid) {
                    return Err(RunDirError::Locked {
                        dir: root.display().to_string(),
                        pid,
                    });
                }
            }
        }
        fs::write(&lock, format!("{}\n", std::process::id())).map_err(io_err(&lock))?;
        Ok(RunDir {
            root: root.to_path_buf(),
        })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// The configuration a previous session of this run recorded, if any.
    pub fn stored_config(&self) -> Result<Option<ConfigFile>, RunDirError> {
        let path = self.root.join("config.toml");
        match fs::read_to_string(&path) {
            Ok(text) => toml::from_str(&text)
                .map(Some)
                .map_err(|e| RunDirError::Io {
                    path: path.display().to_string(),
                    reason: e.to_string(),
                }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(&path)(e)),
        }
    }

    /// Writes the resolved configuration.
    pub fn write_config(&self, resolved_toml: &str) -> Result<(), RunDirError> {
        write_atomic(&self.root.join("config.toml"), resolved_toml.as_bytes())
    }

    /// The trace file for a new session: `trace-0001.json`, `trace-0002.json`, ...
    pub fn next_trace_path(&self) -> PathBuf {
        (1..)
            .map(|i| self.root.join(format!("trace-{i:04}.json")))
            .find(|p| !p.exists())
            .expect("some session number is free")
    }

    /// Appends one step to the learner's record and fsyncs it.
    pub fn append_step(&self, record: &StepRecord) -> Result<(), RunDirError> {
        let path = self.root.join("learner.jsonl");
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(io_err(&path))?;
        let mut line = serde_json::to_string(record).expect("record serialises");
        line.push('\n');
        f.write_all(line.as_bytes()).map_err(io_err(&path))?;
        f.sync_data().map_err(io_err(&path))
    }

    /// The learner's record (intact lines only).
    pub fn read_steps(&self) -> Result<Vec<StepRecord>, RunDirError> {
        let path = self.root.join("learner.jsonl");
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err(&path)(e)),
        };
        let mut out = Vec::new();
        for line in BufReader::new(file).lines() {
            let line = line.map_err(io_err(&path))?;
            match serde_json::from_str(&line) {
                Ok(r) => out.push(r),
                Err(_) => break, // a torn last line
            }
        }
        Ok(out)
    }

    /// Writes a checkpoint of `learner` and `state` at `state.learner_version`: into a temporary
    /// folder first, manifest last, then renamed into place, so a crash leaves either the whole
    /// checkpoint or one that [`RunDir::latest_checkpoint`] skips.
    pub fn write_checkpoint(
        &self,
        learner: &dyn Learner,
        state: &CheckpointState,
    ) -> Result<PathBuf, RunDirError> {
        let dir = self.root.join("checkpoints");
        let final_path = dir.join(format!("step-{:08}", state.learner_version));
        let tmp = dir.join(format!(
            ".tmp-step-{:08}-{}",
            state.learner_version,
            std::process::id()
        ));
        if tmp.exists() {
            fs::remove_dir_all(&tmp).map_err(io_err(&tmp))?;
        }
        fs::create_dir_all(tmp.join("learner")).map_err(io_err(&tmp))?;
        learner.save(&tmp.join("learner"))?;
        let state_json = serde_json::to_vec_pretty(state).expect("state serialises");
        fs::write(tmp.join("state.json"), &state_json).map_err(io_err(&tmp))?;
        let manifest = manifest_of(&tmp)?;
        let complete = tmp.join("COMPLETE");
        let mut f = File::create(&complete).map_err(io_err(&complete))?;
        f.write_all(manifest.as_bytes())
            .map_err(io_err(&complete))?;
        f.sync_all().map_err(io_err(&complete))?;
        if final_path.exists() {
            fs::remove_dir_all(&final_path).map_err(io_err(&final_path))?;
        }
        fs::rename(&tmp, &final_path).map_err(io_err(&final_path))?;
        File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err(&dir))?;
        self.prune_checkpoints();
        Ok(final_path)
    }

    fn checkpoint_dirs(&self) -> Vec<PathBuf> {
        checkpoint_dirs(&self.root)
    }

    fn prune_checkpoints(&self) {
        let dirs = self.checkpoint_dirs();
        if dirs.len() > KEEP_CHECKPOINTS {
            for d in &dirs[..dirs.len() - KEEP_CHECKPOINTS] {
                if let Err(e) = fs::remove_dir_all(d) {
                    tracing::warn!(path = %d.display(), error = %e, "could not delete an old checkpoint");
                }
            }
        }
    }

    /// The newest complete checkpoint, and the incomplete or corrupt ones skipped on the way.
    pub fn latest_checkpoint(&self) -> (Option<(PathBuf, CheckpointState)>, Vec<PathBuf>) {
        let scan = latest_checkpoint_of(&self.root);
        for (dir, reason) in &scan.skipped {
            tracing::warn!(checkpoint = %dir.display(), %reason, "skipping an incomplete checkpoint");
        }
        let skipped = scan.skipped.into_iter().map(|(dir, _)| dir).collect();
        (scan.newest, skipped)
    }

    /// Deletes the WAL segments whose groups the record lines up to `version` all consumed, then
    /// archives the record lines recovery can no longer need. Call it only once a complete
    /// checkpoint at `version` is on disk (see [`crate::wal::compact`]).
    pub fn compact_wal(&self, version: u64) -> Result<Compaction, RunDirError> {
        let steps = self.read_steps()?;
        let c = wal::compact(
            &self.root.join(wal::WAL_DIR),
            &consumed_by(&steps, version),
            None,
        )?;
        self.archive_record(&steps, version, RECORD_ARCHIVE_LINES)?;
        Ok(c)
    }

    /// Moves the record's leading lines that recovery can no longer need to an archive, when there
    /// are at least `min_lines` of them: lines at or before `version` (a checkpoint covers them)
    /// naming only groups below the oldest WAL segment left (deleted, so never pending again).
    /// The archive is written and compressed first, then the record rewritten without those
    /// lines; a crash in between leaves them in both, which [`read_all_steps`] reads once.
    /// `steps` is the record as on disk. Returns the lines moved.
    fn archive_record(
        &self,
        steps: &[StepRecord],
        version: u64,
        min_lines: usize,
    ) -> Result<usize, RunDirError> {
        let Some(oldest) = wal::segments(&self.root.join(wal::WAL_DIR))?
            .first()
            .map(|s| s.first)
        else {
            return Ok(0);
        };
        let n = steps
            .iter()
            .take_while(|s| {
                s.version <= version && s.trained.iter().chain(&s.dropped).all(|q| *q < oldest)
            })
            .count();
        if n == 0 || n < min_lines {
            return Ok(0);
        }
        // A plain archive a crash left is compressed first (only this writer makes them).
        files::finish_pending(&self.root, "learner.").map_err(io_err(&self.root))?;
        let number =
            files::next_archive_number(&self.root, "learner").map_err(io_err(&self.root))?;
        let archive = self.root.join(format!("learner.{number:06}.jsonl"));
        write_atomic(&archive, record_text(&steps[..n]).as_bytes())?;
        files::gzip_in_place(&archive).map_err(io_err(&archive))?;
        write_atomic(
            &self.root.join("learner.jsonl"),
            record_text(&steps[n..]).as_bytes(),
        )?;
        Ok(n)
    }

    /// Finds where the run stopped (see the module documentation), opening the WAL with
    /// segments of `segment_bytes`.
    pub fn recover(&self, segment_bytes: u64) -> Result<Recovery, RunDirError> {
        let (checkpoint, skipped) = self.latest_checkpoint();
        // Set torn checkpoints aside (kept for forensics) so that pruning and later recoveries
        // never mistake them for the newest.
        let mut set_aside = Vec::new();
        for dir in skipped {
            let name = dir
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("step")
                .to_string();
            let target = dir.with_file_name(format!("torn-{name}-{}", std::process::id()));
            fs::rename(&dir, &target).map_err(io_err(&dir))?;
            set_aside.push(target);
        }
        let skipped = set_aside;
        let version = checkpoint.as_ref().map_or(0, |(_, s)| s.learner_version);
        let steps = self.read_steps()?;
        let total_lines = steps.len();
        let kept: Vec<StepRecord> = steps.into_iter().filter(|s| s.version <= version).collect();
        let record_lines_cut = total_lines - kept.len();
        // Rewrite the record only when it holds something to drop: lines past the checkpoint or a
        // torn tail (its length then differs from the intact lines'), not on every start.
        let text = record_text(&kept);
        let record_path = self.root.join("learner.jsonl");
        let on_disk = fs::metadata(&record_path).map(|m| m.len()).ok();
        if on_disk.is_some_and(|len| len != text.len() as u64) {
            write_atomic(&record_path, text.as_bytes())?;
        }
        let consumed = consumed_by(&kept, version);
        let opened = Wal::open(&self.root, segment_bytes, &consumed)?;
        let wal_compaction = wal::compact(opened.wal.dir(), &consumed, None)?;
        self.archive_record(&kept, version, RECORD_ARCHIVE_LINES)?;
        Ok(Recovery {
            checkpoint,
            skipped,
            pending: opened.pending,
            next_seq: opened.next_seq,
            wal: opened.wal,
            record_lines_cut,
            wal_records_read: opened.records_read,
            wal_compaction,
        })
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let lock = self.root.join("kevin.lock");
        if fs::read_to_string(&lock).is_ok_and(|t| t.trim() == std::process::id().to_string()) {
            fs::remove_file(lock).ok();
        }
    }
}

/// The groups consumed (trained on or dropped) by the record lines at or before `version`.
fn consumed_by(steps: &[StepRecord], version: u64) -> BTreeSet<u64> {
    steps
        .iter()
        .filter(|s| s.version <= version)
        .flat_map(|s| s.trained.iter().chain(&s.dropped))
        .copied()
        .collect()
}

/// Record lines as `learner.jsonl` holds them.
fn record_text(steps: &[StepRecord]) -> String {
    let mut text = String::new();
    for s in steps {
        text.push_str(&serde_json::to_string(s).expect("record serialises"));
        text.push('\n');
    }
    text
}

/// Record lines moved to an archive at once (fewer wait for a later checkpoint): a restart parses
/// at most about this many more lines than it needs.
pub const RECORD_ARCHIVE_LINES: usize = 1000;

/// The learner's whole record of the run directory `root`, oldest first: its archives, then
/// `learner.jsonl`; each version once (a crash while archiving can leave a line in both).
pub fn read_all_steps(root: &Path) -> Result<Vec<StepRecord>, RunDirError> {
    let lines = files::RotatingLog::read_all(root, "learner", "jsonl").map_err(io_err(root))?;
    let mut out: Vec<StepRecord> = Vec::new();
    for line in lines {
        let Ok(step) = serde_json::from_str::<StepRecord>(&line) else {
            break; // a torn last line
        };
        if out.last().is_none_or(|l| step.version > l.version) {
            out.push(step);
        }
    }
    Ok(out)
}

/// The `checkpoints/step-*` folders of the run directory `root`, oldest first.
fn checkpoint_dirs(root: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = fs::read_dir(root.join("checkpoints"))
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("step-"))
                })
                .collect()
        })
        .unwrap_or_default();
    dirs.sort();
    dirs
}

/// Whether the run directory `root` has any `checkpoints/step-*` folder, complete or not: a
/// directory listing, nothing read or verified (that is [`latest_checkpoint_of`]'s work).
pub fn has_checkpoint_dirs(root: &Path) -> bool {
    !checkpoint_dirs(root).is_empty()
}

/// What [`latest_checkpoint_of`] found in a run directory.
#[derive(Debug)]
pub struct CheckpointScan {
    /// The newest complete checkpoint: its folder and state.
    pub newest: Option<(PathBuf, CheckpointState)>,
    /// The incomplete or corrupt checkpoint folders passed over on the way, newest first, and
    /// why.
    pub skipped: Vec<(PathBuf, String)>,
}

/// The newest complete checkpoint of the run directory `root`, and the incomplete or corrupt
/// ones skipped on the way, without opening the directory: nothing is locked, written or logged,
/// so a reader (`kevin sweep` deciding whether a run finished) can ask while the run is live or
/// stopped. A missing directory has no checkpoint.
pub fn latest_checkpoint_of(root: &Path) -> CheckpointScan {
    let mut skipped = Vec::new();
    for dir in checkpoint_dirs(root).into_iter().rev() {
        match verify_checkpoint(&dir) {
            Ok(state) => {
                return CheckpointScan {
                    newest: Some((dir, state)),
                    skipped,
                }
            }
            Err(reason) => skipped.push((dir, reason)),
        }
    }
    CheckpointScan {
        newest: None,
        skipped,
    }
}

/// Writes `bytes` to `path` through a temporary file and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), RunDirError> {
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let mut f = File::create(&tmp).map_err(io_err(&tmp))?;
    f.write_all(bytes).map_err(io_err(&tmp))?;
    f.sync_all().map_err(io_err(&tmp))?;
    fs::rename(&tmp, path).map_err(io_err(path))
}

/// "relative/path size hash" per file, sorted, excluding COMPLETE itself.
fn manifest_of(dir: &Path) -> Result<String, RunDirError> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) -> Result<(), RunDirError> {
        for entry in fs::read_dir(dir).map_err(io_err(dir))? {
            let path = entry.map_err(io_err(dir))?.path();
            if path.is_dir() {
                walk(base, &path, out)?;
            } else if path.file_name().is_some_and(|n| n != "COMPLETE") {
                let bytes = fs::read(&path).map_err(io_err(&path))?;
                let rel = path
                    .strip_prefix(base)
                    .unwrap_or(&path)
                    .display()
                    .to_string();
                out.push(format!(
                    "{rel} {} {:016x}",
                    bytes.len(),
                    crate::rng::fnv1a(&bytes)
                ));
            }
        }
        Ok(())
    }
    let mut lines = Vec::new();
    walk(dir, dir, &mut lines)?;
    lines.sort();
    Ok(lines.join("\n") + "\n")
}

fn verify_checkpoint(dir: &Path) -> Result<CheckpointState, String> {
    let expected =
        fs::read_to_string(dir.join("COMPLETE")).map_err(|_| "no COMPLETE manifest".to_string())?;
    let actual = manifest_of(dir).map_err(|e| e.to_string())?;
    if expected != actual {
        return Err("files differ from the COMPLETE manifest".into());
    }
    let text = fs::read_to_string(dir.join("state.json")).map_err(|e| e.to_string())?;
    serde_json::from_str(&text).map_err(|e| format!("state.json: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::SimLearner;

    fn tmp_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("kevin-rundir-{name}-{}", std::process::id()));
        fs::remove_dir_all(&d).ok();
        d
    }

    fn state(v: u64) -> CheckpointState {
        CheckpointState {
            learner_version: v,
            sampler: None,
            replay_pending: vec![],
            counters: Counters::default(),
            written_unix: 0,
        }
    }

    #[test]
    fn torn_checkpoint_is_skipped_for_the_previous_one() {
        let root = tmp_dir("torn");
        let rd = RunDir::open(&root).unwrap();
        let learner = SimLearner::new(0.0);
        rd.write_checkpoint(&learner, &state(1)).unwrap();
        let p2 = rd.write_checkpoint(&learner, &state(2)).unwrap();
        // Corrupt the newest: as if the process died while writing it.
        fs::write(p2.join("state.json"), b"{\"learner_version\": 2, \"sampl").unwrap();
        let (found, skipped) = rd.latest_checkpoint();
        assert_eq!(found.unwrap().1.learner_version, 1);
        assert_eq!(skipped, vec![p2.clone()]);
        // A reader without the lock sees the same, with the reason.
        let scan = latest_checkpoint_of(&root);
        assert_eq!(scan.newest.unwrap().1.learner_version, 1);
        assert_eq!(scan.skipped.len(), 1);
        assert_eq!(scan.skipped[0].0, p2);
        assert!(scan.skipped[0].1.contains("manifest"), "{:?}", scan.skipped);
        // And one without a manifest at all.
        fs::remove_file(p2.join("COMPLETE")).unwrap();
        assert_eq!(rd.latest_checkpoint().0.unwrap().1.learner_version, 1);
        drop(rd);
        fs::remove_dir_all(&root).ok();
    }

    #[test]
    fn only_the_newest_checkpoints_are_kept() {
        let root = tmp_dir("prune");
        let rd = RunDir::open(&root).unwrap();
        let learner = SimLearner::new(0.0);
        for v in 1..=5 {
            rd.write_checkpoint(&learner, &state(v)).unwrap();
        }
        assert_eq!(rd.checkpoint_dirs().len(), KEEP_CHECKPOINTS);
        assert_eq!(rd.latest_checkpoint().0.unwrap().1.learner_version, 5);
        drop(rd);
        fs::remove_dir_all(&root).ok();
    }

    #[test]
    fn a_live_owner_locks_the_directory() {
        let root = tmp_dir("lock");
        fs::create_dir_all(&root).unwrap();
        // PID 1 is always alive.
        fs::write(root.join("kevin.lock"), "1\n").unwrap();
        let err = RunDir::open(&root).unwrap_err().to_string();
        assert!(err.contains("in use by process 1"), "{err}");
        // A dead owner (a pid far beyond pid_max) is taken over.
        fs::write(root.join("kevin.lock"), "4294967295\n").unwrap();
        let rd = RunDir::open(&root).unwrap();
        drop(rd);
        assert!(
            !root.join("kevin.lock").exists(),
            "the lock is released on drop"
        );
        fs::remove_dir_all(&root).ok();
    }

    #[test]
    fn recovery_requeues_unconsumed_groups_and_cuts_redone_steps() {
        use crate::config::ReplaySection;
        use crate::replay::ReplayBuffer;
        let root = tmp_dir("recover");
        let rd = RunDir::open(&root).unwrap();
        // One group per segment (1-byte segments), so that compaction has work.
        let opened = Wal::open(&root, 1, &BTreeSet::new()).unwrap();
        let mut q = ReplayBuffer::new(
            ReplaySection::default(),
            Some(Box::new(opened.wal)),
            vec![],
            0,
        );
        for id in 0..5 {
            let g = crate::episode::Group {
                id,
                task: "t".into(),
                trajectories: vec![],
            };
            q.accept(g).unwrap();
        }
        let rec = |version, trained: Vec<u64>, dropped: Vec<u64>| StepRecord {
            version,
            trained,
            dropped,
            stats: TrainStats::default(),
        };
        rd.append_step(&rec(1, vec![0], vec![1])).unwrap();
        rd.write_checkpoint(&SimLearner::new(0.0), &state(1))
            .unwrap();
        // Step 2 happened but its checkpoint did not: it must be redone.
        rd.append_step(&rec(2, vec![2, 3], vec![])).unwrap();
        drop(q);
        let r = rd.recover(1).unwrap();
        assert_eq!(r.checkpoint.as_ref().unwrap().1.learner_version, 1);
        assert_eq!(r.record_lines_cut, 1);
        assert_eq!(
            r.pending.iter().map(|g| g.seq).collect::<Vec<_>>(),
            vec![2, 3, 4]
        );
        assert_eq!(r.next_seq, 5);
        assert_eq!(r.wal_records_read, 5);
        assert_eq!(rd.read_steps().unwrap().len(), 1);
        // Groups 0 and 1 were consumed by step 1, which the checkpoint covers: their segments go.
        assert_eq!(r.wal_compaction.deleted, 2);
        drop(r);
        let r = rd.recover(1).unwrap();
        assert_eq!(r.wal_records_read, 3, "a restart reads only what is left");
        assert_eq!(r.next_seq, 5);
        drop(r);
        // Step 2 redone and checkpointed: segments 2 and 3 go; 4 is pending, and active.
        rd.append_step(&rec(2, vec![2, 3], vec![])).unwrap();
        rd.write_checkpoint(&SimLearner::new(0.0), &state(2))
            .unwrap();
        assert_eq!(rd.compact_wal(2).unwrap().deleted, 2);
        let r = rd.recover(1).unwrap();
        assert_eq!(r.pending.iter().map(|g| g.seq).collect::<Vec<_>>(), vec![4]);
        assert_eq!((r.wal_records_read, r.next_seq), (1, 5));
        drop(r);
        // Both record lines name only groups of deleted segments and a checkpoint covers them:
        // they move to an archive, and the whole record still reads back.
        let steps = rd.read_steps().unwrap();
        assert_eq!(rd.archive_record(&steps, 2, 1).unwrap(), 2);
        assert!(rd.read_steps().unwrap().is_empty());
        assert!(root.join("learner.000001.jsonl.gz").exists());
        let all = read_all_steps(&root).unwrap();
        assert_eq!(all.iter().map(|s| s.version).collect::<Vec<_>>(), [1, 2]);
        // A crash between writing the archive and rewriting the record: lines in both are read
        // once, and recovery still finds group 4 pending.
        rd.append_step(&rec(3, vec![4], vec![])).unwrap();
        let live = fs::read(root.join("learner.jsonl")).unwrap();
        fs::write(root.join("learner.000002.jsonl"), &live).unwrap();
        files::gzip_in_place(&root.join("learner.000002.jsonl")).unwrap();
        let all = read_all_steps(&root).unwrap();
        assert_eq!(all.iter().map(|s| s.version).collect::<Vec<_>>(), [1, 2, 3]);
        let r = rd.recover(1).unwrap();
        assert_eq!(r.pending.iter().map(|g| g.seq).collect::<Vec<_>>(), [4]);
        drop(rd);
        fs::remove_dir_all(&root).ok();
    }
}
