//! `kevin bench pipeline`: what the actor system itself costs, and what asynchrony buys.
//!
//! 1. Overhead: the whole system (sampler, rollout, generator, compiler, verifier, profiler,
//!    replay queue with its fsynced WAL, learner) with zero-latency simulated components, so
//!    all the time measured is the system's own: turns per second and CPU microseconds per turn.
//! 2. Async vs sync: the same system with the simulated latencies of a real run (a generation
//!    batch takes about a second, an evaluation tens of milliseconds, a learner step about a
//!    second), each mode for the same wall-clock time.

use std::path::Path;
use std::time::{Duration, Instant};

use kevin::config::{Config, ConfigFile, Mode};

use crate::system::{self, TrainOptions, TrainSummary};

/// Process CPU time (user + system) in seconds, from /proc (Linux); None elsewhere.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0) // USER_HZ is 100 on Linux
}

fn run(
    file: ConfigFile,
    stop_after: Option<Duration>,
) -> Result<(TrainSummary, f64, Option<f64>), String> {
    let dir = std::env::temp_dir().join(format!(
        "kevin-bench-{}-{}",
        std::process::id(),
        file.run.name
    ));
    std::fs::remove_dir_all(&dir).ok();
    let config = Config::from_file(file).map_err(|e| e.to_string())?;
    let (t0, c0) = (Instant::now(), cpu_seconds());
    let shutdown = async move {
        match stop_after {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending::<()>().await,
        }
    };
    let summary = system::train(
        TrainOptions {
            config,
            run_dir: dir.clone(),
            trace_stats: None,
        },
        shutdown,
    )
    .map_err(|e| e.to_string())?;
    let wall = t0.elapsed().as_secs_f64();
    let cpu = c0.zip(cpu_seconds()).map(|(a, b)| b - a);
    std::fs::remove_dir_all(&dir).ok();
    Ok((summary, wall, cpu))
}

fn zero_latency(steps: u64) -> ConfigFile {
    let mut f = ConfigFile::default();
    f.run.name = "overhead".into();
    f.run.max_steps = steps;
    f.run.checkpoint_every = steps.max(1);
    f.rollout.trajectories = 16;
    f.rollout.turns = 4;
    f.rollout.max_inflight_groups = 32;
    f.replay.tasks_per_batch = 8;
    f.replay.max_staleness = 1_000_000;
    f.policy.simulated.batch_ms = 0.0;
    f.policy.simulated.token_ms = 0.0;
    f.policy.simulated.response_tokens = 16;
    f.env.simulated.compile_ms = 0.0;
    f.env.simulated.verify_ms = 0.0;
    f.env.simulated.profile_ms = 0.0;
    f.learner.simulated.step_ms = 0.0;
    f.telemetry.trace = false;
    f.telemetry.episodes = false;
    f
}

fn realistic(mode: Mode) -> ConfigFile {
    let mut f = ConfigFile::default();
    f.run.name = format!("{mode:?}").to_lowercase();
    f.run.mode = mode;
    f.run.checkpoint_every = 1_000;
    f.run.drain_timeout_s = 30.0;
    f.rollout.trajectories = 8;
    f.rollout.turns = 2;
    f.replay.tasks_per_batch = 4;
    f.rollout.max_inflight_groups = if mode == Mode::Sync { 4 } else { 12 };
    f.replay.max_staleness = if mode == Mode::Sync { 0 } else { 2 };
    f.policy.simulated.batch_ms = 1000.0;
    f.policy.simulated.token_ms = 0.0;
    f.sampling.max_batch = 64;
    f.env.compile_workers = 8;
    f.env.verify_workers = 2;
    f.env.profile_workers = 1;
    f.env.simulated.compile_ms = 40.0;
    f.env.simulated.verify_ms = 20.0;
    f.env.simulated.profile_ms = 20.0;
    f.learner.simulated.step_ms = 500.0;
    f.telemetry.trace = false;
    f.telemetry.episodes = false;
    f
}

/// Runs both parts and prints a markdown report (also written to `out`).
pub fn pipeline(steps: u64, seconds: f64, out: Option<&Path>) -> Result<(), String> {
    let mut report = String::from("## Pipeline overhead (zero-latency simulated components)\n\n");
    let (s, wall, cpu) = run(zero_latency(steps), None)?;
    let turns = s.turns.max(1) as f64;
    report += "| learner steps | turns | wall s | turns/s | wall us/turn | CPU us/turn |\n|---|---|---|---|---|---|\n";
    report += &format!(
        "| {} | {} | {:.2} | {:.0} | {:.1} | {} |\n\n",
        s.steps,
        s.turns,
        wall,
        turns / wall,
        wall / turns * 1e6,
        cpu.map(|c| format!("{:.1}", c / turns * 1e6))
            .unwrap_or_else(|| "n/a".into())
    );
    eprintln!("{report}");
    report += &format!(
        "## Async vs sync ({seconds} s each; generation batch 1 s, evaluation 80 ms, learner step 2 x 0.5 s)\n\n\
         | mode | turns | trajectories/hour | learner steps | steps/min | wall s |\n|---|---|---|---|---|---|\n"
    );
    let mut rates = Vec::new();
    for mode in [Mode::Async, Mode::Sync] {
        let file = realistic(mode);
        let n = file.rollout.turns as f64;
        let (s, wall, _) = run(file, Some(Duration::from_secs_f64(seconds)))?;
        let traj_per_hour = s.turns as f64 / n / wall * 3600.0;
        rates.push(traj_per_hour);
        report += &format!(
            "| {mode:?} | {} | {:.0} | {} | {:.1} | {:.1} |\n",
            s.turns,
            traj_per_hour,
            s.steps,
            s.steps as f64 / wall * 60.0,
            wall
        );
        eprintln!("{mode:?}: {} turns in {wall:.1} s", s.turns);
    }
    report += &format!(
        "\nasync / sync trajectories per hour: {:.2}x\n",
        rates[0] / rates[1].max(1e-9)
    );
    println!("{report}");
    if let Some(path) = out {
        std::fs::write(path, &report).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}
