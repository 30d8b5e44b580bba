//! `kevin train`: the training daemon. Loads the config (layers: defaults < file <
//! `KEVIN__SECTION__KEY`), sets up logging and the trace, runs the actor pipeline until the
//! learner reaches its last step or SIGINT/SIGTERM, and prints where the run is.

use std::path::PathBuf;
use std::process::ExitCode;

use kevin::config::Config;

use super::{env_vars, failure, init_logging, signals, usage, CmdResult, DEFAULT_CONFIG};
use crate::pipeline::system::{self, StopReason, TrainOptions};

/// Train a policy: a long-running daemon. Stop it with Ctrl-C (SIGINT) or SIGTERM; run the
/// same command again to resume from the run directory.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Experiment config (TOML). Layers: defaults < this file < KEVIN__SECTION__KEY=value.
    /// Default: configs/quickstart.toml, or the config stored in --run-dir when resuming.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Run directory (default: <run.runs_dir>/<run.name>).
    #[arg(long)]
    pub run_dir: Option<PathBuf>,
    /// Stop when the learner reaches this version (overrides run.max_steps).
    #[arg(long)]
    pub max_steps: Option<u64>,
}

/// Resolves SIGINT or SIGTERM.
/// Resolves on the first SIGINT or SIGTERM since [`signals::install`] (at the start of
/// [`run`], so a signal during startup counts too); a second one ends the process at once.
async fn shutdown_signal() {
    while signals::received() == 0 {
        tokio::time::sleep(SIGNAL_POLL).await;
    }
    eprintln!("kevin: stopping (drain, checkpoint); send the signal again only if you must abandon in-flight work");
    std::thread::spawn(|| loop {
        if signals::received() >= 2 {
            eprintln!("kevin: second signal: exiting without draining; groups already accepted are in the write-ahead log, in-flight ones are lost");
            std::process::exit(130);
        }
        std::thread::sleep(SIGNAL_POLL);
    });
}

/// How often the daemon looks at the signal count.
const SIGNAL_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// Runs the daemon; `log` is the global `--log` filter (default: the config's
/// `telemetry.log_level`).
pub fn run(args: Args, log: Option<&str>) -> CmdResult {
    signals::install();
    let Args {
        config,
        run_dir,
        max_steps,
    } = args;
    // Resuming a run directory without --config uses the config stored in it.
    let stored = run_dir
        .as_ref()
        .map(|d| d.join("config.toml"))
        .filter(|p| p.exists());
    let path = match (config, stored) {
        (Some(p), _) => p,
        (None, Some(stored)) => stored,
        (None, None) => {
            let p = PathBuf::from(DEFAULT_CONFIG);
            if !p.exists() {
                return Err(usage(format!(
                    "the default config {DEFAULT_CONFIG} is not here (run kevin from the repository root or pass --config FILE)"
                )));
            }
            p
        }
    };
    let mut config = Config::load(Some(&path), &env_vars()).map_err(usage)?;
    if let Some(n) = max_steps {
        config.file.run.max_steps = n;
        config.sources.push(format!("--max-steps {n}"));
    }
    let run_dir = config.run_dir(run_dir.as_deref());
    std::fs::create_dir_all(&run_dir)
        .map_err(|e| failure(format!("run directory {}: {e}", run_dir.display())))?;
    let trace = if config.telemetry.trace {
        Some(
            kevin::telemetry::session_trace_path(&run_dir)
                .map_err(|e| failure(format!("run directory {}: {e}", run_dir.display())))?,
        )
    } else {
        None
    };
    let filter = log.map_or_else(|| config.telemetry.log_level.clone(), str::to_string);
    let rotate_bytes = config.telemetry.rotate_kb.saturating_mul(1 << 10);
    let guard =
        init_logging(&filter, trace.as_deref().map(|p| (p, rotate_bytes))).map_err(usage)?;
    tracing::info!(config = %path.display(), layers = %config.sources.join(" < "), "config");
    let trace_stats = guard.as_ref().map(|g| g.stats());
    let result = system::train(
        TrainOptions {
            config,
            run_dir,
            trace_stats,
        },
        shutdown_signal(),
    );
    if let Some(guard) = guard {
        match guard.finish() {
            Ok(s) if s.dropped > 0 => tracing::warn!(
                dropped = s.dropped,
                "trace records dropped (writer fell behind)"
            ),
            Ok(_) => {}
            Err(e) => tracing::error!(error = %e, "could not finish the trace file"),
        }
    }
    match result {
        Ok(s) => {
            let why = match s.reason {
                StopReason::MaxSteps => "max steps reached",
                StopReason::Signal => "stopped by signal",
                StopReason::DiskLow(_) => "stopped: the disk is nearly full",
            };
            println!(
                "kevin train: {why}; learner version {} ({} steps this session{}), {} turns; run directory {}",
                s.version,
                s.steps,
                s.resumed_from.map(|v| format!(", resumed from {v}")).unwrap_or_default(),
                s.turns,
                s.run_dir.display()
            );
            if let Some(c) = s.checkpoint {
                println!("checkpoint: {}", c.display());
            }
            println!(
                "inspect it with: kevin inspect {0}; plot it with: kevin report {0}",
                s.run_dir.display()
            );
            match s.reason {
                StopReason::DiskLow(why) => Err(failure(format!(
                    "{why}; the run is checkpointed: free space (or lower run.min_free_disk_mb) and run the same command again to resume"
                ))),
                _ => Ok(ExitCode::SUCCESS),
            }
        }
        Err(e @ system::TrainError::ConfigMismatch { .. }) => Err(usage(e)),
        Err(e) => Err(failure(e)),
    }
}
