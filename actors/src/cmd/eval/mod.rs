//! `kevin eval`: kernels from a folder (`kernels`) or a policy checkpoint's trajectories
//! (`checkpoint`, the paper's Table 1 and Table 2 shapes). Both judge through a real kernel
//! environment (`super::backends`); the checkpoint evaluation runs the same turn step as the
//! training rollout (`kevin::policy_eval`).
//!
//! Dependency direction: this folder imports `super` (the shared command helpers) and the core
//! crates, never `crate::pipeline`, `crate::cli` or another command.

pub mod checkpoint;
pub mod kernels;

use std::path::PathBuf;
use std::process::ExitCode;

use super::{cores, env_vars, failure, usage, CmdResult};

/// The flags of `kevin eval` (its help text is in `crate::cli`).
#[derive(clap::Args, Debug, Clone, PartialEq)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["kernels", "checkpoint", "base"])))]
pub struct Args {
    /// Folder of `<task>.cu` files (e.g. tasks/solutions).
    #[arg(long)]
    pub kernels: Option<PathBuf>,
    /// A policy checkpoint: a Hugging Face Qwen2 directory (config.json, tokenizer.json,
    /// model.safetensors), e.g. models/kevin-tiny or RUN/checkpoints/step-N/learner.
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
    /// Compare two checkpoints: the `--json` files of this one's evaluations (comma-separated,
    /// one per seed) against those of `--new`, paired by seed (issue 19's rule: a figure is up
    /// when it rose by more than twice the spread between evaluations of one checkpoint).
    #[arg(long, value_delimiter = ',', requires = "new")]
    pub base: Vec<PathBuf>,
    /// With --base: the new checkpoint's evaluation files, one per seed of --base.
    #[arg(long, value_delimiter = ',', requires = "base")]
    pub new: Vec<PathBuf>,
    /// K: trajectories per task (default 16, the paper's).
    #[arg(long, requires = "checkpoint", conflicts_with = "budget")]
    pub samples: Option<u32>,
    /// Kernels per task instead of --samples: K = B / --turns (B must be a multiple of
    /// --turns). Equal budgets compare serial refinement with parallel sampling.
    #[arg(long, requires = "checkpoint")]
    pub budget: Option<u32>,
    /// N: refinement turns per trajectory, with --checkpoint (the paper evaluates 8).
    #[arg(long, default_value_t = 8)]
    pub turns: u32,
    /// Task split of --checkpoint: "heldout" (never trained on), "train" or "all".
    #[arg(long, default_value = "heldout", value_parser = checkpoint::SPLITS)]
    pub split: String,
    /// Only these tasks (comma-separated; with --checkpoint each must be in --split).
    #[arg(long, value_delimiter = ',')]
    pub tasks: Vec<String>,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// With --checkpoint: write every turn (task, trajectory, turn, prompt, response, outcome
    /// and its reason) to this file as JSON lines, to read what the policy wrote.
    #[arg(long, requires = "checkpoint")]
    pub transcripts: Option<PathBuf>,
    /// Execution backend: "cpu" (no GPU needed; small preset) or "cuda" (GPU preset). Default:
    /// cuda where nvidia-smi lists a GPU, else cpu.
    #[arg(long, value_parser = super::backends::BACKENDS)]
    pub backend: Option<String>,
    /// Where the policy runs: "cpu" (burn NdArray), "cuda" (GPU 0) or "auto" (cuda where
    /// nvidia-smi lists a GPU). Default: the config's policy.burn.device (auto).
    #[arg(long, requires = "checkpoint", value_parser = checkpoint::DEVICES)]
    pub device: Option<String>,
    /// Sampling temperature (default: the config's sampling.temperature, 0.9).
    #[arg(long, requires = "checkpoint")]
    pub temperature: Option<f64>,
    /// Maximum tokens per response (default: the config's sampling.max_new_tokens, 4096).
    #[arg(long, requires = "checkpoint")]
    pub max_new_tokens: Option<u32>,
    /// Base seed of --checkpoint's sampling seeds (each turn's seed derives from it, the
    /// task, the trajectory and the turn).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// A training config (TOML) whose [sampling], rollout.prompt_budget_chars and
    /// [policy.burn] (device, max_len, seed) apply; default: the built-in defaults. The
    /// flags above override it; KEVIN__SECTION__KEY variables apply as for kevin train.
    #[arg(long, requires = "checkpoint")]
    pub config: Option<PathBuf>,
    /// The task suite's folder, or several joined by `:` (e.g. `tasks:/data/gen`).
    #[arg(long, default_value = "tasks")]
    pub dir: PathBuf,
    /// On cuda: "exclusive" times each kernel under the GPU-wide timing lease (a policy or
    /// another kevin process on the GPU pauses between its steps; with --checkpoint this
    /// process's own generator too); "shared" without it. Default: exclusive (with --checkpoint:
    /// the config's env.timing, exclusive unless set).
    #[arg(long, value_parser = ["exclusive", "shared"])]
    pub timing: Option<String>,
}

/// `--base A.json,... --new B.json,...`: the comparison table, and with `--json` its JSON.
fn compare(args: &Args) -> CmdResult {
    use kevin::policy_eval::compare;
    let read = |paths: &[PathBuf]| {
        paths
            .iter()
            .map(|p| compare::Evaluation::read(p))
            .collect::<Result<Vec<_>, _>>()
            .map_err(usage)
    };
    let (base, new) = (read(&args.base)?, read(&args.new)?);
    let c = compare::compare(&base, &new).map_err(usage)?;
    print!("{}", compare::render(&c));
    if let Some(path) = &args.json {
        let mut v = serde_json::to_value(&c).map_err(failure)?;
        v["command"] = serde_json::json!("kevin eval --base --new");
        v["base_files"] = serde_json::json!(args.base);
        v["new_files"] = serde_json::json!(args.new);
        super::write_json(path, &v).map_err(failure)?;
    }
    Ok(ExitCode::SUCCESS)
}

impl Args {
    /// `--timing`, when given.
    pub fn timing(&self) -> Result<Option<kevin::config::GpuTiming>, super::CmdError> {
        self.timing
            .as_deref()
            .map(kevin::config::GpuTiming::parse)
            .transpose()
            .map_err(usage)
    }
}

/// Runs the checkpoint or the kernels evaluation, or compares two checkpoints' evaluations.
pub fn run(args: Args) -> CmdResult {
    if !args.base.is_empty() {
        return compare(&args);
    }
    if let Some(checkpoint) = &args.checkpoint {
        checkpoint::main(&args, checkpoint, &env_vars())?;
        return Ok(ExitCode::SUCCESS);
    }
    // clap's group makes one of --kernels and --checkpoint present.
    let Some(kernels) = &args.kernels else {
        return Err(usage("give --kernels DIR or --checkpoint DIR"));
    };
    let dir = &args.dir;
    let suite = kevin::tasks::TaskSuite::load(dir)
        .map_err(|e| usage(format!("task suite {}: {e}", dir.display())))?;
    let parallel = cores();
    let timing = args
        .timing()?
        .unwrap_or(kevin::config::GpuTiming::Exclusive);
    let env = super::backends::eval_env_timed(
        args.backend.as_deref(),
        suite.clone(),
        dir,
        parallel,
        kevin::env::Deadlines::default(),
        timing,
    )
    .map_err(failure)?;
    kernels::main(
        env,
        &suite,
        kernels,
        &args.tasks,
        parallel,
        args.json.as_deref(),
    )
    .map_err(failure)?;
    Ok(ExitCode::SUCCESS)
}
