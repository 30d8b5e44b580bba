//! The command line: `kevin train | sweep | eval | bench | inspect | report | tasks | sft |
//! policy | worker-node` (and the hidden `worker`). Each command's flags and behaviour live in its `crate::cmd`
//! module; this file holds only the command enum and the dispatch.
//!
//! Conventions shared by every command: results are printed, and also written as JSON with
//! `--json FILE` (and as markdown with `--out FILE` where a command writes markdown; `kevin
//! report --out DIR` is a folder); `--dir` is the task suite's folder and `--tasks` a list of
//! task names; logging goes to stderr at [`crate::cmd::DEFAULT_LOG`] unless `--log` or
//! `RUST_LOG` says otherwise, coloured only on a terminal.
//!
//! Exit codes: 0 success, 1 failure, 2 usage or configuration error.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::cmd;

pub use crate::cmd::DEFAULT_CONFIG;

/// kevin: multi-turn RL that teaches language models to write fast CUDA kernels.
#[derive(Parser, Debug)]
#[command(name = "kevin", version, about, long_about = None)]
pub struct Cli {
    /// Log filter (tracing EnvFilter syntax, e.g. "info" or "kevin=debug"); default "info"
    /// (kevin train: the config's telemetry.log_level), or RUST_LOG when set.
    #[arg(long, global = true)]
    pub log: Option<String>,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Train a policy: a long-running daemon. Stop it with Ctrl-C (SIGINT) or SIGTERM; run the
    /// same command again to resume from the run directory.
    Train(cmd::train::Args),
    /// Train variants of one config side by side: one `kevin train` child per variant (the
    /// product of the --set values, or with --zip their values paired), each in a run directory
    /// named after its overrides, with sweep.json beside them. Every key and value is checked
    /// before anything starts. Ctrl-C stops the running variants cleanly; the same command again
    /// resumes the unfinished ones and skips the finished.
    Sweep(cmd::sweep::Args),
    /// Evaluate kernels (`--kernels DIR`) or a policy checkpoint (`--checkpoint DIR`).
    ///
    /// `--kernels DIR`: the `<task>.cu` files of DIR, one kernel per task: a table per task
    /// (outcome, speedup, times, spread) and a summary (correct rate, fast_p, mean and
    /// geometric-mean speedup).
    ///
    /// `--checkpoint DIR`: a burn policy (Hugging Face Qwen2 directory) writes K trajectories of
    /// N refinement turns per task (default: the held-out split, which training never sees), with
    /// the training rollout's prompts, history and feedback; the shape of the paper's Table 1.
    /// Per task and overall: avg@K (fraction of trajectories with a correct kernel at any turn),
    /// best@K (task solved by any trajectory), correctness at each turn t and by turn t, mean
    /// speedup (best correct speedup per task, unsolved tasks counted as 0; also per trajectory,
    /// avg@K-style), geometric-mean speedup over solved tasks, fast_p (fast_1: a correct kernel
    /// faster than the reference), format-error rate and mean response tokens.
    ///
    /// Serial refinement vs parallel sampling at an equal number of kernels (Table 2): give
    /// --budget B instead of --samples, so K = B / N; e.g. `--turns 4 --budget 64` (16 x 4)
    /// against `--turns 1 --budget 64` (64 x 1).
    Eval(cmd::eval::Args),
    /// Benchmark the system itself. `hacks` and `faults` are pass/fail suites (exit 1 on any
    /// mismatch) that also report measured figures; they stay under `bench` by that name.
    Bench(cmd::bench::Args),
    /// Per-actor busy/idle, message counts, latencies, mailbox high-water marks and the slowest
    /// spans of a run, from its trace files and metrics.jsonl.
    Inspect(cmd::inspect::Args),
    /// PNG plots over learner steps (reward, correctness, mean speedup, staleness, actor
    /// utilisation) and summary.md (config, steps, wall time, trajectories/hour, first vs last
    /// window means) from a run directory's metrics.jsonl. Several run directories (or a sweep's
    /// folder) are compared: one line per run, labelled by the settings in which they differ,
    /// and a summary table of those settings and each run's figures. Unreadable lines are
    /// skipped and named; run directories are only read, so live runs can be reported on.
    Report(cmd::report::Args),
    /// List the task suite (name, level, split, sizes), or show a task's first-turn prompt.
    Tasks(cmd::tasks::Args),
    /// Supervised warm-start: build the verified corpus, train the tokenizer, train the policy.
    Sft(cmd::sft::Args),
    /// The burn policy's model: `init` writes a random-initialised checkpoint to start from.
    Policy(cmd::policy::Args),
    /// Evaluate jobs for `env.kind = "remote"` daemons: pull them from a NATS JetStream queue,
    /// compile, check and time each with this machine's cpu or cuda backend, publish the
    /// outcome, then acknowledge the job. Runs until Ctrl-C (SIGINT) or SIGTERM, finishing the
    /// jobs in hand. Exits 1 when the server cannot be reached or refuses the credentials.
    WorkerNode(cmd::worker_node::Args),
    /// Serve as an evaluation worker process (internal: started by kevin itself).
    #[command(hide = true)]
    Worker {
        /// Arguments of the worker.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

/// The binary's entry point.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let log = cli.log.as_deref();
    let result = match cli.command {
        // main() normally takes `kevin worker ...` before clap; this is the same worker reached
        // through clap (e.g. with a global flag before the subcommand).
        Command::Worker { args } => {
            return ExitCode::from(kevin::roles::child_main_from_args(&args).clamp(0, 255) as u8)
        }
        // The daemon sets up its own logging: the config's level and the trace file.
        Command::Train(args) => cmd::train::run(args, log),
        command => {
            if let Err(e) = cmd::init_logging(log.unwrap_or(cmd::DEFAULT_LOG), None) {
                return cmd::exit_code(Err(cmd::usage(e)));
            }
            match command {
                Command::Eval(args) => cmd::eval::run(args),
                Command::Bench(args) => cmd::bench::run(args),
                Command::Inspect(args) => cmd::inspect::run(args),
                Command::Report(args) => cmd::report::run(args),
                Command::Sweep(args) => cmd::sweep::run(args),
                Command::Tasks(args) => cmd::tasks::run(args),
                Command::Sft(args) => cmd::sft::run(args),
                Command::Policy(args) => cmd::policy::run(args),
                Command::WorkerNode(args) => cmd::worker_node::run(args),
                Command::Train(_) | Command::Worker { .. } => unreachable!("matched above"),
            }
        }
    };
    cmd::exit_code(result)
}
