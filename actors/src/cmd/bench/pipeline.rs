//! `kevin bench pipeline`: what the actor system itself costs, and what asynchrony buys.
//!
//! 1. Overhead: the whole system (sampler, rollout, generator, compiler, verifier, profiler,
//!    replay queue with its fsynced WAL, learner) with zero-latency simulated components, so
//!    all the time measured is the system's own: turns per second and CPU microseconds per turn.
//! 2. Async vs sync: the same system with the simulated latencies of a real run (a generation
//!    batch takes about a second, an evaluation tens of milliseconds, a learner step about a
//!    second), each mode for the same wall-clock time.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use kevin::config::{Config, ConfigFile, Mode};

use crate::cmd::{failure, write_json, CmdResult};
use crate::pipeline::system::{self, TrainOptions, TrainSummary};

/// The flags of `kevin bench pipeline`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Learner steps of the zero-latency run.
    #[arg(long, default_value_t = 60)]
    pub steps: u64,
    /// Seconds each of the async and sync runs lasts.
    #[arg(long, default_value_t = 20.0)]
    pub seconds: f64,
    /// Also write the results as markdown to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Also write the figures as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Runs the benchmark with the flags.
pub fn run(args: &Args) -> CmdResult {
    pipeline(
        args.steps,
        args.seconds,
        args.out.as_deref(),
        args.json.as_deref(),
    )
    .map_err(failure)?;
    Ok(ExitCode::SUCCESS)
}

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

fn run_system(
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
    simulated_latencies(&mut f, [0.0; 4]);
    f
}

/// Sets the simulated stage latencies (ms: compile, verify, profile, learner step) and turns off
/// the trace and the episode log, so that only the system itself is measured.
fn simulated_latencies(f: &mut ConfigFile, [compile, verify, profile, step]: [f64; 4]) {
    f.env.simulated.compile_ms = compile;
    f.env.simulated.verify_ms = verify;
    f.env.simulated.profile_ms = profile;
    f.learner.simulated.step_ms = step;
    f.telemetry.trace = false;
    f.telemetry.episodes = false;
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
    simulated_latencies(&mut f, [40.0, 20.0, 20.0, 500.0]);
    f
}

/// Runs both parts and prints a markdown report (also written to `out`; the figures as JSON to
/// `json`).
pub fn pipeline(
    steps: u64,
    seconds: f64,
    out: Option<&Path>,
    json: Option<&Path>,
) -> Result<(), String> {
    let mut report = String::from("## Pipeline overhead (zero-latency simulated components)\n\n");
    let (s, wall, cpu) = run_system(zero_latency(steps), None)?;
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
    let mut figures = serde_json::json!({
        "overhead": {
            "learner_steps": s.steps,
            "turns": s.turns,
            "wall_s": wall,
            "turns_per_s": turns / wall,
            "wall_us_per_turn": wall / turns * 1e6,
            "cpu_us_per_turn": cpu.map(|c| c / turns * 1e6),
        },
        "seconds": seconds,
        "modes": [],
    });
    report += &format!(
        "## Async vs sync ({seconds} s each; generation batch 1 s, evaluation 80 ms, learner step 2 x 0.5 s)\n\n\
         | mode | turns | trajectories/hour | learner steps | steps/min | wall s |\n|---|---|---|---|---|---|\n"
    );
    let mut rates = Vec::new();
    for mode in [Mode::Async, Mode::Sync] {
        let file = realistic(mode);
        let n = file.rollout.turns as f64;
        let (s, wall, _) = run_system(file, Some(Duration::from_secs_f64(seconds)))?;
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
        figures["modes"]
            .as_array_mut()
            .expect("modes is an array")
            .push(serde_json::json!({
                "mode": format!("{mode:?}"),
                "turns": s.turns,
                "trajectories_per_hour": traj_per_hour,
                "learner_steps": s.steps,
                "wall_s": wall,
            }));
    }
    report += &format!(
        "\nasync / sync trajectories per hour: {:.2}x\n",
        rates[0] / rates[1].max(1e-9)
    );
    figures["async_over_sync"] = serde_json::json!(rates[0] / rates[1].max(1e-9));
    println!("{report}");
    if let Some(path) = out {
        std::fs::write(path, &report).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if let Some(path) = json {
        write_json(path, &figures)?;
    }
    Ok(())
}
