//! `kevin bench modes --config FILE --seconds S`: one config trained in async mode and in sync
//! mode for the same wall-clock time, with the config's real components (issue 8's async vs
//! sync; `kevin bench pipeline` does the same with simulated latencies).
//!
//! Each mode is a real `kevin train` in a child process on a fresh run directory, with only
//! `run.mode` and `replay.max_staleness` changed (async: the config's staleness, or 2 where the
//! config has 0; sync: 0) and tracing on. The child gets SIGINT two seconds after its window and
//! drains as a user's Ctrl-C does; what it does while draining is not counted. From the child's
//! trace and metrics.jsonl, over the first S seconds of its session:
//! - groups done (`GroupDone` spans of the replay queue) and trajectories per hour;
//! - learner steps, and the reward and correct rate of those steps (reward at equal wall-clock);
//! - the busy share of each actor, and of the accelerator actors together (Generator, Learner,
//!   Verifier, Profiler: on a GPU config everything that holds the GPU; an upper bound on GPU
//!   busy time, since an open span may be waiting on the host).
//!
//! `--warmup W` first trains W seconds in a scratch directory and discards it, so that neither
//! timed run pays the one-time work of a fresh machine (burn's CUDA kernels, the CUBIN cache).
//! It goes on past W until its first learner step (at most 600 s more): a warm-up that never
//! reached the learner left the learner's compilation (35 s on an H100) to the first timed mode.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use kevin::config::{Config, Mode};
use kevin::metrics::StepMetrics;
use serde::Serialize;

use crate::cmd::report::MetricsLog;
use crate::cmd::{failure, CmdResult, DEFAULT_CONFIG};

/// The actors whose spans hold the accelerator on a GPU config.
pub const ACCELERATOR_ACTORS: [&str; 4] = ["Generator", "Learner", "Verifier", "Profiler"];
/// The replay queue's span for a finished group.
const GROUP_DONE: &str = "GroupDone";
/// Seconds past the window before the child is asked to stop.
const STOP_MARGIN_S: f64 = 2.0;
/// How long past `--warmup` the warm-up waits for its first learner step.
const WARMUP_STEP_WAIT_S: f64 = 600.0;

/// The flags of `kevin bench modes`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The config to compare. KEVIN__* variables apply.
    #[arg(long, default_value = DEFAULT_CONFIG)]
    pub config: PathBuf,
    /// Wall-clock seconds each mode is measured.
    #[arg(long, default_value_t = 300.0)]
    pub seconds: f64,
    /// Seconds of a discarded async run first, so that neither timed run pays a fresh
    /// machine's one-time work (burn's CUDA kernels, the CUBIN cache); it goes on until its
    /// first learner step (at most 600 s more).
    #[arg(long, default_value_t = 0.0)]
    pub warmup: f64,
    /// Folder for the run directories (warmup, async, sync; replaced if present).
    #[arg(long, default_value = "runs/bench-modes")]
    pub dir: PathBuf,
    /// Also write the results as markdown to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Also write the figures as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Measure one mode only (`async` or `sync`), e.g. to give each mode a long window where
    /// a machine is lent for a limited time; the ratio is then left to the reader.
    #[arg(long, value_parser = parse_mode)]
    pub only: Option<Mode>,
}

fn parse_mode(s: &str) -> Result<Mode, String> {
    match s {
        "async" => Ok(Mode::Async),
        "sync" => Ok(Mode::Sync),
        other => Err(format!("{other}: expected async or sync")),
    }
}

/// Runs the comparison with the flags.
pub fn run_cmd(args: &Args) -> CmdResult {
    run(args).map_err(failure)?;
    Ok(ExitCode::SUCCESS)
}

/// One mode's figures over its window.
#[derive(Clone, Debug, Serialize)]
pub struct ModeResult {
    /// "async" or "sync".
    pub mode: String,
    /// `replay.max_staleness` of the run.
    pub max_staleness: u64,
    /// The run directory (trace, metrics, checkpoints, log).
    pub run_dir: PathBuf,
    /// Seconds measured (the window, or the whole session when it ended first).
    pub seconds: f64,
    /// Groups finished in the window.
    pub groups: u64,
    /// Trajectories finished in the window (groups x trajectories per group).
    pub trajectories: u64,
    /// Trajectories per hour of wall-clock time.
    pub trajectories_per_hour: f64,
    /// Learner steps recorded in the window.
    pub learner_steps: u64,
    /// Turns completed per second between the window's first and last learner step (None with
    /// fewer than two): the steady rate, without the session's start (burn's first kernel
    /// compilations, the pipeline filling) and counting turns of groups still in flight, which
    /// `trajectories_per_hour` leaves out.
    pub steady_turns_per_s: Option<f64>,
    /// Mean of the window's steps' mean reward (None: no step).
    pub reward_mean: Option<f64>,
    /// Mean reward of the window's last step.
    pub reward_last: Option<f64>,
    /// Mean of the window's steps' correct rate.
    pub correct_rate: Option<f64>,
    /// Percent of the window during which an accelerator actor was busy.
    pub accelerator_busy_pct: f64,
    /// Percent of the window during which each actor was busy.
    pub busy_pct: BTreeMap<String, f64>,
    /// Percent of the candidates up to the window's last learner step that the evaluation
    /// cache answered whole (None: no cache, or no step).
    pub cache_answered_pct: Option<f64>,
    /// How the child ended: "stopped" (SIGINT, drained), "killed" (no exit after the drain
    /// timeout) or "exited early: STATUS".
    pub ended: String,
}

/// The whole comparison.
#[derive(Clone, Debug, Serialize)]
pub struct ModesReport {
    /// The config file.
    pub config: PathBuf,
    /// Seconds per mode.
    pub seconds: f64,
    /// Warm-up seconds before the timed runs.
    pub warmup: f64,
    /// Trajectories per group, turns per trajectory.
    pub trajectories: u32,
    /// Turns per trajectory.
    pub turns: u32,
    /// Async first, then sync.
    pub modes: Vec<ModeResult>,
    /// Async trajectories per hour over sync's (None when sync finished none).
    pub async_over_sync: Option<f64>,
    /// Async's steady turns per second over sync's (None without both).
    pub steady_async_over_sync: Option<f64>,
    /// Set when the config leaves async mode no room to run ahead of the learner.
    pub note: Option<String>,
}

/// Runs the comparison, prints the markdown report and writes the requested files.
pub fn run(args: &Args) -> Result<ModesReport, String> {
    if !(args.seconds.is_finite() && args.seconds >= 1.0) {
        return Err(format!(
            "--seconds {}: must be at least 1 (the wall-clock time each mode runs)",
            args.seconds
        ));
    }
    if !(args.warmup.is_finite() && args.warmup >= 0.0) {
        return Err(format!("--warmup {}: must be 0 or more", args.warmup));
    }
    let vars: Vec<(String, String)> = std::env::vars().collect();
    let config = Config::load(Some(&args.config), &vars).map_err(|e| e.to_string())?;
    let file = &config.file;
    let async_staleness = if file.replay.max_staleness == 0 {
        2
    } else {
        file.replay.max_staleness
    };
    std::fs::create_dir_all(&args.dir).map_err(|e| format!("{}: {e}", args.dir.display()))?;
    let exe = kevin::worker::own_binary().map_err(|e| format!("the kevin binary: {e}"))?;

    if args.warmup > 0.0 {
        let dir = args.dir.join("warmup");
        eprintln!(
            "warm-up: {} s of async training in {}, and until its first learner step",
            args.warmup,
            dir.display()
        );
        let cap = args.warmup + WARMUP_STEP_WAIT_S;
        train_for(
            &exe,
            args,
            &dir,
            Mode::Async,
            async_staleness,
            args.warmup,
            Some(cap),
        )?;
        if lines(&dir.join(crate::cmd::report::METRICS_FILE)) == 0 {
            eprintln!(
                "warning: the warm-up took no learner step in {cap} s; the first timed mode pays \
                 the learner's first compilation"
            );
        }
    }
    let mut modes = Vec::new();
    for (mode, staleness) in [(Mode::Async, async_staleness), (Mode::Sync, 0)] {
        if args.only.is_some_and(|only| only != mode) {
            continue;
        }
        let dir = args.dir.join(mode_name(mode));
        let ended = train_for(&exe, args, &dir, mode, staleness, args.seconds, None)?;
        let result = measure(
            &dir,
            mode,
            staleness,
            args.seconds,
            file.rollout.trajectories,
            ended,
        )?;
        eprintln!(
            "{}: {} trajectories in {:.0} s, {} learner steps",
            result.mode, result.trajectories, result.seconds, result.learner_steps
        );
        modes.push(result);
    }
    // Async's figure over sync's, when both ran and sync's is positive.
    let ratio = |f: fn(&ModeResult) -> Option<f64>| match modes.as_slice() {
        [a, s] => f(a).zip(f(s)).filter(|&(_, s)| s > 0.0).map(|(a, s)| a / s),
        _ => None,
    };
    let async_over_sync = ratio(|m| Some(m.trajectories_per_hour));
    let steady_async_over_sync = ratio(|m| m.steady_turns_per_s);
    // A group holds its slot until the learner consumes it: with no more slots than a batch,
    // generation waits for the learner in async mode too.
    let note = (file.rollout.max_inflight_groups <= file.replay.tasks_per_batch).then(|| {
        format!(
            "rollout.max_inflight_groups ({}) is not above replay.tasks_per_batch ({}): async \
             generation cannot run ahead of the learner, so the modes differ little \
             (KEVIN__ROLLOUT__MAX_INFLIGHT_GROUPS raises it for both)",
            file.rollout.max_inflight_groups, file.replay.tasks_per_batch
        )
    });
    if let Some(n) = &note {
        eprintln!("note: {n}");
    }
    let report = ModesReport {
        config: args.config.clone(),
        seconds: args.seconds,
        warmup: args.warmup,
        trajectories: file.rollout.trajectories,
        turns: file.rollout.turns,
        modes,
        async_over_sync,
        steady_async_over_sync,
        note,
    };
    crate::cmd::emit_report(
        &markdown(&report),
        args.out.as_deref(),
        args.json.as_deref(),
        &report,
    )?;
    Ok(report)
}

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Async => "async",
        Mode::Sync => "sync",
    }
}

/// Trains `mode` in a fresh `dir` for `seconds` (then SIGINT and drain); returns how it ended.
/// With `first_step_by`, a child that has taken no learner step by then goes on until its first
/// one or until that many seconds, whichever comes first: a warm-up must reach the learner, or
/// the first timed mode compiles the learner's kernels in its window.
fn train_for(
    exe: &Path,
    args: &Args,
    dir: &Path,
    mode: Mode,
    staleness: u64,
    seconds: f64,
    first_step_by: Option<f64>,
) -> Result<String, String> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let log_path = dir.join("train.log");
    let log =
        std::fs::File::create(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
    let err = log.try_clone().map_err(|e| e.to_string())?;
    let mut child = Command::new(exe)
        .arg("train")
        .arg("--config")
        .arg(&args.config)
        .arg("--run-dir")
        .arg(dir)
        .args(["--max-steps", "1000000000"])
        .env("KEVIN__RUN__MODE", mode_name(mode))
        .env("KEVIN__REPLAY__MAX_STALENESS", staleness.to_string())
        .env("KEVIN__TELEMETRY__TRACE", "true")
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("{}: {e}", exe.display()))?;
    let metrics = dir.join(crate::cmd::report::METRICS_FILE);
    let t0 = Instant::now();
    let mut next_progress = 15.0;
    let deadline = seconds + STOP_MARGIN_S;
    loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            return early_exit(status, &log_path);
        }
        let elapsed = t0.elapsed().as_secs_f64();
        let stepped = || lines(&metrics) > 0;
        if elapsed >= deadline && first_step_by.is_none_or(|cap| elapsed >= cap || stepped()) {
            break;
        }
        if elapsed >= next_progress {
            eprintln!(
                "{}: {:.0}/{:.0} s, {} learner steps{}",
                mode_name(mode),
                elapsed,
                seconds,
                lines(&metrics),
                if first_step_by.is_some() && elapsed > seconds && !stepped() {
                    " (waiting for the first)"
                } else {
                    ""
                }
            );
            let _ = std::io::stderr().flush();
            next_progress += 15.0;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    interrupt(&child);
    eprintln!("{}: stopping (drain, checkpoint)", mode_name(mode));
    Ok(wait_or_kill(&mut child, Duration::from_secs(600)))
}

/// Sends SIGINT to a child `kevin train`: it drains and checkpoints as on a user's Ctrl-C.
pub(crate) fn interrupt(child: &Child) {
    // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGINT);
    }
}

/// A child that ended before its window: an error when it failed (with its log's tail).
pub(crate) fn early_exit(status: ExitStatus, log: &Path) -> Result<String, String> {
    if status.success() {
        return Ok(format!("exited early: {status}"));
    }
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(5).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    Err(format!(
        "kevin train failed ({status}); {}:\n{}",
        log.display(),
        tail.join("\n")
    ))
}

/// Waits up to `grace` for a child to exit, then kills it; says which.
pub(crate) fn wait_or_kill(child: &mut Child, grace: Duration) -> String {
    let t0 = Instant::now();
    while t0.elapsed() < grace {
        if let Ok(Some(_)) = child.try_wait() {
            return "stopped".into();
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = child.kill();
    let _ = child.wait();
    "killed".into()
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|t| t.lines().filter(|l| !l.trim().is_empty()).count())
        .unwrap_or(0)
}

/// The figures of one finished run over its first `seconds`.
fn measure(
    dir: &Path,
    mode: Mode,
    staleness: u64,
    seconds: f64,
    trajectories: u32,
    ended: String,
) -> Result<ModeResult, String> {
    let w = kevin::telemetry::window(dir, seconds, GROUP_DONE, &ACCELERATOR_ACTORS)
        .map_err(|e| e.to_string())?;
    let steps: Vec<StepMetrics> =
        match MetricsLog::read(&dir.join(crate::cmd::report::METRICS_FILE)) {
            Ok(log) => log
                .steps
                .into_iter()
                .filter(|m| m.elapsed_s <= w.seconds)
                .collect(),
            Err(_) => Vec::new(), // no learner step finished: the figures say so
        };
    let mean = |f: fn(&StepMetrics) -> f64| {
        (!steps.is_empty()).then(|| steps.iter().map(f).sum::<f64>() / steps.len() as f64)
    };
    let done = w.counted * u64::from(trajectories);
    let steady_turns_per_s = steady_rate(&steps);
    Ok(ModeResult {
        mode: mode_name(mode).into(),
        max_staleness: staleness,
        run_dir: dir.to_owned(),
        seconds: w.seconds,
        groups: w.counted,
        trajectories: done,
        trajectories_per_hour: if w.seconds > 0.0 {
            done as f64 / w.seconds * 3600.0
        } else {
            0.0
        },
        learner_steps: steps.len() as u64,
        steady_turns_per_s,
        reward_mean: mean(|m| m.reward_mean),
        reward_last: steps.last().map(|m| m.reward_mean),
        correct_rate: mean(|m| m.correct_rate),
        accelerator_busy_pct: w.union_busy_pct,
        busy_pct: w.busy_pct,
        cache_answered_pct: steps
            .last()
            .and_then(|m| kevin::env::CacheStats::answered_share(&m.eval_cache))
            .map(|share| share * 100.0),
        ended,
    })
}

/// Turns per second between the first and the last of `steps` (one session's, in order), from
/// each step's session rate and time; None with fewer than two steps or no time between them.
fn steady_rate(steps: &[StepMetrics]) -> Option<f64> {
    let turns = |m: &StepMetrics| m.turns_per_s * m.elapsed_s;
    let (first, last) = (steps.first()?, steps.last()?);
    let seconds = last.elapsed_s - first.elapsed_s;
    (steps.len() >= 2 && seconds > 0.0).then(|| (turns(last) - turns(first)) / seconds)
}

/// The report as markdown: a table per mode and the ratio.
pub fn markdown(r: &ModesReport) -> String {
    let opt = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"));
    let busy = |m: &ModeResult, actor: &str| {
        m.busy_pct
            .get(actor)
            .map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"))
    };
    let mut s = format!(
        "## Async vs sync: {}, {} s of wall-clock each{}\n\n\
         {} trajectories x {} turns per group. Accelerator actors: {}.\n\n\
         | mode | max_staleness | seconds | groups | trajectories | trajectories/hour | learner steps | steady turns/s | reward (mean of steps) | reward (last step) | correct rate | accelerator actors busy % | Generator busy % | Learner busy % | answered by the cache % | ended |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        r.config.display(),
        r.seconds,
        if r.warmup > 0.0 {
            format!(" (after a discarded {} s warm-up)", r.warmup)
        } else {
            String::new()
        },
        r.trajectories,
        r.turns,
        ACCELERATOR_ACTORS.join(", "),
    );
    for m in &r.modes {
        s += &format!(
            "| {} | {} | {:.1} | {} | {} | {:.0} | {} | {} | {} | {} | {} | {:.1} | {} | {} | {} | {} |\n",
            m.mode,
            m.max_staleness,
            m.seconds,
            m.groups,
            m.trajectories,
            m.trajectories_per_hour,
            m.learner_steps,
            m.steady_turns_per_s
                .map_or_else(|| "-".to_owned(), |v| format!("{v:.2}")),
            opt(m.reward_mean),
            opt(m.reward_last),
            opt(m.correct_rate),
            m.accelerator_busy_pct,
            busy(m, "Generator"),
            busy(m, "Learner"),
            m.cache_answered_pct
                .map_or_else(|| "-".to_owned(), |v| format!("{v:.1}")),
            m.ended,
        );
    }
    s += &match r.async_over_sync {
        Some(x) => format!("\nasync / sync trajectories per hour: {x:.2}x\n"),
        None if r.modes.len() < 2 => {
            "\nasync / sync trajectories per hour: - (one mode run)\n".to_owned()
        }
        None => "\nasync / sync trajectories per hour: - (sync finished no group)\n".to_owned(),
    };
    if let Some(x) = r.steady_async_over_sync {
        s += &format!(
            "async / sync steady turns per second (between the first and last learner step of \
             each window): {x:.2}x\n"
        );
    }
    if let Some(n) = &r.note {
        s += &format!("\nNote: {n}.\n");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(elapsed_s: f64, turns: f64) -> StepMetrics {
        StepMetrics {
            elapsed_s,
            turns_per_s: turns / elapsed_s,
            ..StepMetrics::default()
        }
    }

    #[test]
    fn the_steady_rate_runs_from_the_first_step_to_the_last() {
        // 100 turns by the first step at 60 s (the slow start), 356 by the third at 100 s.
        let steps = [step(60.0, 100.0), step(80.0, 228.0), step(100.0, 356.0)];
        let rate = steady_rate(&steps).unwrap();
        assert!((rate - 256.0 / 40.0).abs() < 1e-9, "{rate}");
        assert_eq!(steady_rate(&steps[..1]), None);
        assert_eq!(steady_rate(&[]), None);
        assert_eq!(steady_rate(&[step(5.0, 1.0), step(5.0, 1.0)]), None);
    }
}
