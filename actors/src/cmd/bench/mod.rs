//! `kevin bench ...`: the benchmarks, one module each (`pipeline`, `gpu`, `policy`, `modes`,
//! `soak`, `remote`, `hacks`, `faults`), with the environment flags `hacks` and `faults` share ([`EnvArgs`]).
//!
//! `hacks` and `faults` are pass/fail suites (exit 1 on a mismatch) but stay under `bench`: they
//! also report measured figures (evaluation times, throughput, respawn latency), and external
//! suites call them by that name.
//!
//! Dependency direction: a benchmark may import `crate::pipeline` (the pipeline benchmark runs
//! the actor system), `super` (shared command helpers, `backends`) and `super::report`'s
//! metrics reader; nothing outside `cmd` imports from here.

pub mod faults;
pub mod gpu;
pub mod hacks;
pub mod modes;
pub mod pipeline;
pub mod policy;
pub mod remote;
pub mod soak;

use std::path::PathBuf;

use clap::Subcommand;

use super::{failure, usage, workers_or_cores, CmdError, CmdResult};

/// Benchmark the system itself. `hacks` and `faults` are pass/fail suites (exit status 1 on any
/// mismatch) that also report measured figures; they stay under `bench` by that name.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// What to benchmark.
    #[command(subcommand)]
    pub what: BenchCommand,
}

/// `kevin bench` subcommands.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// The actor pipeline's own cost with zero-latency simulated components, and async vs sync
    /// throughput with the simulated latencies of a real run.
    Pipeline(pipeline::Args),
    /// The burn policy's speed: batched generation (KV cache, continuous batching, sampling) and
    /// learner steps (forward, backward, AdamW) on a random-weight Qwen2; with `--hf FILE` (the
    /// JSON of benches/hf_policy.py, run on the same machine) the ratios to transformers.
    Policy(policy::Args),
    /// The GPU harness on this machine's GPU: NVRTC compile latency, end-to-end evaluation
    /// throughput on level-1 solutions, timing repeatability of one kernel, and replacement of
    /// workers killed by illegal-address faults.
    Gpu(gpu::Args),
    /// The adversarial suite (tests/data/hacks/): every known reward hack and fault must get its
    /// expected outcome on this backend, and the reference solutions of its tasks must pass. One
    /// line per case; exit status 1 on any mismatch.
    Hacks(hacks::Args),
    /// A fault storm: --count evaluations mixing the adversarial suite's faulty candidates with
    /// valid reference solutions, shuffled, submitted concurrently. Reports crashes, lost and
    /// misattributed results, verdict and speedup changes of valid candidates against a clean
    /// run, worker respawns and their latency, throughput. Exit status 1 when anything was lost
    /// or misattributed or a valid verdict changed.
    Faults(faults::Args),
    /// Async vs sync with real components: the config trained in async mode, then in sync mode
    /// (only run.mode and replay.max_staleness change), each a `kevin train` child for the same
    /// wall-clock time, stopped by SIGINT. Reports per mode, over its window: groups and
    /// trajectories per hour, learner steps, reward and correct rate of those steps, and the busy
    /// share of each actor and of the accelerator actors together (from the trace); then the
    /// async / sync ratio of trajectories per hour.
    Modes(modes::Args),
    /// What a long run costs: a `kevin train` child (by default configs/soak.toml, the real actor
    /// system with simulated components at a high rate) for --turns turns or --hours, sampled
    /// every --sample-s for resident memory, run-directory and write-ahead-log size; then a
    /// restart on the same directory. Reports turns/s, RSS growth after warm-up, disk against
    /// the budget, and restart time before and after.
    Soak(soak::Args),
    /// Remote evaluation through NATS JetStream against the local pool, side by side: the
    /// latency of one evaluation and the throughput of many, with `kevin worker-node` processes on
    /// this machine (`--backend sim`: the bus alone). Starts a nats-server of its own without
    /// `--nats`.
    Remote(remote::Args),
}

/// Runs the benchmark.
pub fn run(args: Args) -> CmdResult {
    match args.what {
        BenchCommand::Pipeline(a) => pipeline::run(&a),
        BenchCommand::Policy(a) => policy::run(&a),
        BenchCommand::Gpu(a) => gpu::run(&a),
        BenchCommand::Hacks(a) => hacks::run_cmd(&a),
        BenchCommand::Faults(a) => faults::run_cmd(&a),
        BenchCommand::Modes(a) => modes::run_cmd(&a),
        BenchCommand::Soak(a) => soak::run_cmd(&a),
        BenchCommand::Remote(a) => remote::run_cmd(&a),
    }
}

/// The environment a `kevin bench hacks|faults` run evaluates with.
#[derive(clap::Args, Debug, Clone)]
pub struct EnvArgs {
    /// Execution backend: "cpu" (no GPU needed) or "cuda"; default cuda where nvidia-smi lists a
    /// GPU, else cpu.
    #[arg(long, value_parser = super::backends::BACKENDS)]
    pub backend: Option<String>,
    /// The task suite's folder (reference solutions in its `solutions/`), or several joined by `:`.
    #[arg(long, default_value = "tasks")]
    pub dir: PathBuf,
    /// The adversarial suite's folder (with hacks.toml).
    #[arg(long, default_value = "tests/data/hacks")]
    pub hacks: PathBuf,
    /// Worker processes (default: one per CPU core): the CPU backend's workers, or the cuda
    /// backend's compile workers (its GPU workers are a fixed few per GPU). On a GPU machine,
    /// keep the default: compile bombs hold a compile worker until the compile deadline.
    #[arg(long)]
    pub workers: Option<usize>,
    /// Deadline of one compilation (ms).
    #[arg(long, default_value_t = 20_000)]
    pub compile_timeout_ms: u64,
    /// Deadline of one correctness check (ms); every hung candidate costs this much.
    #[arg(long, default_value_t = 5_000)]
    pub verify_timeout_ms: u64,
    /// Deadline of one timing run (ms).
    #[arg(long, default_value_t = 30_000)]
    pub profile_timeout_ms: u64,
    /// cuda: "exclusive" (default) times each candidate under the GPU-wide timing lease (other
    /// kevin processes on the GPU pause between steps); "shared" without it.
    #[arg(long, default_value = "exclusive", value_parser = ["exclusive", "shared"])]
    pub timing: String,
}

impl EnvArgs {
    /// The stage deadlines of the flags.
    pub fn deadlines(&self) -> kevin::env::Deadlines {
        kevin::env::Deadlines {
            compile_ms: self.compile_timeout_ms,
            verify_ms: self.verify_timeout_ms,
            profile_ms: self.profile_timeout_ms,
        }
    }

    /// `--backend`, or the default backend.
    pub fn backend(&self) -> &str {
        self.backend
            .as_deref()
            .unwrap_or_else(|| kevin::machine::default_backend())
    }

    /// `--workers`, or one per CPU core.
    pub fn workers(&self) -> usize {
        workers_or_cores(self.workers)
    }

    /// The environment of the flags (a missing task suite is a usage error).
    pub fn env(&self) -> Result<std::sync::Arc<dyn kevin::env::KernelEnv>, CmdError> {
        let suite = kevin::tasks::TaskSuite::load(&self.dir)
            .map_err(|e| usage(format!("task suite {}: {e}", self.dir.display())))?;
        let timing = kevin::config::GpuTiming::parse(&self.timing).map_err(usage)?;
        super::backends::eval_env_timed(
            Some(self.backend()),
            suite,
            &self.dir,
            self.workers(),
            self.deadlines(),
            timing,
        )
        .map_err(failure)
    }
}

/// The median of `v` (the mean of the middle two for an even count), sorting it; None when empty.
pub(crate) fn median(v: &mut [f64]) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => None,
        n if n % 2 == 1 => Some(v[n / 2]),
        n => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_of_even_and_odd() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&mut []), None);
    }
}
