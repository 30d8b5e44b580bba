//! Running the variants: each a real `kevin train --config BASE --run-dir DIR` child (this very
//! binary), its overrides as `KEVIN__*` variables, its stdout and stderr appended to
//! `DIR/train.log`, at most `parallel` at once, each GPU-bound child on GPUs of its own
//! (`CUDA_VISIBLE_DEVICES`).
//!
//! Signals: the children run in process groups of their own, so a Ctrl-C at the terminal reaches
//! the sweep alone, and the sweep forwards exactly one SIGINT to each running child (which drains
//! and checkpoints, as `kevin train` does on Ctrl-C) and starts nothing new; a second SIGINT or
//! SIGTERM kills the children (SIGKILL: in-flight work is lost, accepted groups stay in each
//! run's WAL). A child whose sweep dies gets SIGINT from the kernel (`PR_SET_PDEATHSIG`), so no
//! run is left training unwatched.
//!
//! Progress goes to stderr: a line when a variant starts, finishes, stops or fails (with its
//! exit code and log), and every minute the learner step of each running one.

use std::collections::VecDeque;
use std::io::Write;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::manifest::{progress, Manifest, Status, LOG_FILE};
use super::plan::Variant;

/// How often the sweep looks at its children and at the signals.
const POLL: Duration = Duration::from_millis(100);
/// How often the sweep says where its running variants are.
const PROGRESS_EVERY: Duration = Duration::from_secs(60);
/// Lines of a failed child's log quoted on stderr.
const LOG_TAIL_LINES: usize = 5;

/// What the sweep needs to start a child.
pub struct Launcher<'a> {
    /// The `kevin` binary.
    pub exe: &'a Path,
    /// The base config, as given.
    pub config: &'a Path,
    /// The folder of the run directories and the manifest.
    pub dir: &'a Path,
    /// Children at once.
    pub parallel: usize,
    /// `CUDA_VISIBLE_DEVICES` of each GPU slot (None: the children are not placed on GPUs).
    pub gpu_slots: Option<Vec<String>>,
}

/// A running child.
struct Running {
    /// Its variant's index.
    index: usize,
    child: Child,
    /// The GPU slot it holds.
    slot: Option<usize>,
    started: Instant,
}

/// How a session of the sweep ended.
pub struct Ended {
    /// Whether a signal stopped it (unfinished variants were stopped or not started).
    pub by_signal: bool,
}

impl Launcher<'_> {
    /// Trains every variant of `manifest` that is not finished, updating and rewriting the
    /// manifest as they start and end, until all ended or a signal stopped the sweep.
    pub fn run(&self, variants: &[Variant], manifest: &mut Manifest) -> Result<Ended, String> {
        crate::cmd::signals::install();
        let mut queue: VecDeque<usize> = (0..variants.len())
            .filter(|i| manifest.variants[*i].status != Status::Finished)
            .collect();
        let mut free_slots: Vec<usize> = self
            .gpu_slots
            .as_ref()
            .map_or_else(Vec::new, |s| (0..s.len()).rev().collect());
        let mut running: Vec<Running> = Vec::new();
        let mut signals_seen = 0;
        let mut next_progress = Instant::now() + PROGRESS_EVERY;
        loop {
            let signals = crate::cmd::signals::received();
            if signals > signals_seen {
                self.forward(signals_seen == 0, &running, variants);
                signals_seen = signals;
            }
            let mut i = 0;
            while i < running.len() {
                match running[i].child.try_wait() {
                    Ok(Some(status)) => {
                        let r = running.swap_remove(i);
                        free_slots.extend(r.slot);
                        self.ended(&r, status, signals_seen > 0, variants, manifest)?;
                    }
                    Ok(None) => i += 1,
                    Err(e) => return Err(format!("waiting for a kevin train child: {e}")),
                }
            }
            while signals_seen == 0 && running.len() < self.parallel {
                let Some(index) = queue.pop_front() else {
                    break;
                };
                let slot = free_slots.pop();
                match self.spawn(&variants[index], slot) {
                    Ok(child) => {
                        let v = &variants[index];
                        eprintln!(
                            "sweep: {} started (pid {}{}); log {}",
                            v.name,
                            child.id(),
                            self.slot_note(slot),
                            v.dir.join(LOG_FILE).display()
                        );
                        let rec = &mut manifest.variants[index];
                        rec.status = Status::Running;
                        rec.exit_code = None;
                        rec.note = None;
                        running.push(Running {
                            index,
                            child,
                            slot,
                            started: Instant::now(),
                        });
                    }
                    Err(e) => {
                        free_slots.extend(slot);
                        eprintln!("sweep: {} failed to start: {e}", variants[index].name);
                        let rec = &mut manifest.variants[index];
                        rec.status = Status::Failed;
                        rec.note = Some(format!("could not start: {e}"));
                    }
                }
                manifest.write(self.dir)?;
            }
            if running.is_empty() && (queue.is_empty() || signals_seen > 0) {
                return Ok(Ended {
                    by_signal: signals_seen > 0,
                });
            }
            if Instant::now() >= next_progress {
                next_progress += PROGRESS_EVERY;
                let states: Vec<String> = running
                    .iter()
                    .map(|r| {
                        let v = &variants[r.index];
                        format!(
                            "{} at step {}/{} ({:.0} s)",
                            v.name,
                            learner_steps(&v.dir),
                            v.config.run.max_steps,
                            r.started.elapsed().as_secs_f64()
                        )
                    })
                    .collect();
                if signals_seen == 0 {
                    eprintln!(
                        "sweep: {} running: {}; {} waiting",
                        running.len(),
                        states.join("; "),
                        queue.len()
                    );
                } else {
                    eprintln!("sweep: stopping: {} draining", states.join("; "));
                }
            }
            std::thread::sleep(POLL);
        }
    }

    /// The first signal: SIGINT to every running child; a later one: SIGKILL.
    fn forward(&self, first: bool, running: &[Running], variants: &[Variant]) {
        let names: Vec<&str> = running
            .iter()
            .map(|r| variants[r.index].name.as_str())
            .collect();
        let signal = if first {
            eprintln!(
                "sweep: stopping: SIGINT to {} running variant(s) ({}), which drain and \
                 checkpoint; no new variant starts; run the same command again to resume. \
                 Another Ctrl-C kills them.",
                running.len(),
                names.join(", ")
            );
            libc::SIGINT
        } else {
            eprintln!(
                "sweep: killing {} running variant(s) (SIGKILL: in-flight work is lost, accepted \
                 groups stay in each run's WAL)",
                running.len()
            );
            libc::SIGKILL
        };
        for r in running {
            // SAFETY: kill(2) on the pid of a child this process spawned and has not reaped.
            unsafe {
                libc::kill(r.child.id() as libc::pid_t, signal);
            }
        }
        let _ = std::io::stderr().flush();
    }

    /// Starts `kevin train` for `v` on GPU slot `slot`.
    fn spawn(&self, v: &Variant, slot: Option<usize>) -> Result<Child, String> {
        std::fs::create_dir_all(&v.dir).map_err(|e| format!("{}: {e}", v.dir.display()))?;
        let log_path = v.dir.join(LOG_FILE);
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| format!("{}: {e}", log_path.display()))?;
        let overrides: Vec<String> = v
            .env()
            .iter()
            .map(|(k, val)| format!("{k}={val}"))
            .collect();
        let _ = writeln!(
            log,
            "--- kevin sweep: kevin train --config {} --run-dir {} with {} (unix time {}) ---",
            self.config.display(),
            v.dir.display(),
            overrides.join(" "),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        );
        let err = log.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(self.exe);
        cmd.arg("train")
            .arg("--config")
            .arg(self.config)
            .arg("--run-dir")
            .arg(&v.dir)
            .envs(v.env())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .process_group(0);
        if let (Some(slots), Some(slot)) = (&self.gpu_slots, slot) {
            cmd.env("CUDA_VISIBLE_DEVICES", &slots[slot]);
        }
        // SAFETY: prctl(2) is async-signal-safe and touches nothing of the parent's memory.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGINT);
                Ok(())
            });
        }
        cmd.spawn()
            .map_err(|e| format!("{}: {e}", self.exe.display()))
    }

    fn slot_note(&self, slot: Option<usize>) -> String {
        match (&self.gpu_slots, slot) {
            (Some(slots), Some(s)) => format!(", CUDA_VISIBLE_DEVICES={}", slots[s]),
            _ => String::new(),
        }
    }

    /// Records how a child ended: finished (its run directory says so), stopped (a signal, or
    /// a clean exit before `run.max_steps`) or failed.
    fn ended(
        &self,
        r: &Running,
        status: ExitStatus,
        stopping: bool,
        variants: &[Variant],
        manifest: &mut Manifest,
    ) -> Result<(), String> {
        let v = &variants[r.index];
        let p = progress(&v.dir, v.config.run.max_steps);
        let rec = &mut manifest.variants[r.index];
        rec.version = p.version;
        rec.exit_code = status.code();
        let how = match (status.code(), status.signal()) {
            (Some(c), _) => format!("exit code {c}"),
            (None, Some(s)) => format!("signal {s}"),
            (None, None) => status.to_string(),
        };
        let at = p.version.map_or_else(
            || "no checkpoint".to_string(),
            |v| format!("learner version {v}"),
        );
        let secs = r.started.elapsed().as_secs_f64();
        (rec.status, rec.note) = if p.finished && status.success() {
            (Status::Finished, None)
        } else if p.finished {
            (
                Status::Failed,
                Some(format!("reached run.max_steps but ended with {how}")),
            )
        } else if status.success()
            || (stopping && matches!(status.signal(), Some(libc::SIGINT | libc::SIGKILL)))
        {
            (
                Status::Stopped,
                Some(format!("at {at} ({how}); the next sweep resumes it")),
            )
        } else {
            (Status::Failed, Some(format!("{how}, {at}")))
        };
        match rec.status {
            Status::Failed => {
                eprintln!(
                    "sweep: {} failed after {secs:.0} s: {}; log {}",
                    v.name,
                    rec.note.as_deref().unwrap_or(""),
                    rec.log.display()
                );
                for line in log_tail(&rec.log) {
                    eprintln!("  | {line}");
                }
            }
            Status::Finished => {
                eprintln!("sweep: {} finished in {secs:.0} s ({at}, {how})", v.name)
            }
            _ => eprintln!(
                "sweep: {} stopped after {secs:.0} s: {}",
                v.name,
                rec.note.as_deref().unwrap_or("")
            ),
        }
        manifest.write(self.dir)
    }
}

/// Learner steps recorded in a run directory so far: the version of the record's last line
/// (its archives included; versions count steps from 1).
fn learner_steps(dir: &Path) -> usize {
    kevin::run_dir::read_all_steps(dir)
        .ok()
        .and_then(|steps| steps.last().map(|s| s.version as usize))
        .unwrap_or(0)
}

/// The last lines of a log, to say why a child failed.
fn log_tail(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(LOG_TAIL_LINES)..]
        .iter()
        .map(|l| l.to_string())
        .collect()
}
