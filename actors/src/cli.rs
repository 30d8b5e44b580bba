//! The command line: `kevin train | eval | bench | inspect | report | tasks | sft | policy` (and the
//! hidden `worker`).
//!
//! Exit codes: 0 success, 1 failure, 2 usage or configuration error.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use kevin::config::Config;
use tracing_subscriber::filter::{filter_fn, EnvFilter};
use tracing_subscriber::prelude::*;

use crate::system::{self, StopReason, TrainOptions};

/// The default config of `kevin train`, relative to the repository root.
pub const DEFAULT_CONFIG: &str = "configs/quickstart.toml";

/// kevin: multi-turn RL that teaches language models to write fast CUDA kernels.
#[derive(Parser, Debug)]
#[command(name = "kevin", version, about, long_about = None)]
pub struct Cli {
    /// Log filter (tracing EnvFilter syntax, e.g. "info" or "kevin=debug"); default: the config's
    /// telemetry.log_level, or RUST_LOG when set.
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
    Train {
        /// Experiment config (TOML). Layers: defaults < this file < KEVIN__SECTION__KEY=value.
        /// Default: configs/quickstart.toml, or the config stored in --run-dir when resuming.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Run directory (default: <run.runs_dir>/<run.name>).
        #[arg(long)]
        run_dir: Option<PathBuf>,
        /// Stop when the learner reaches this version (overrides run.max_steps).
        #[arg(long)]
        max_steps: Option<u64>,
    },
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
    #[command(group(clap::ArgGroup::new("what").required(true).args(["kernels", "checkpoint"])))]
    Eval {
        /// Folder of `<task>.cu` files (e.g. tasks/solutions).
        #[arg(long)]
        kernels: Option<PathBuf>,
        /// A policy checkpoint: a Hugging Face Qwen2 directory (config.json, tokenizer.json,
        /// model.safetensors), e.g. models/kevin-tiny or RUN/checkpoints/step-N/learner.
        #[arg(long)]
        checkpoint: Option<PathBuf>,
        /// K: trajectories per task (default 16, the paper's).
        #[arg(long, requires = "checkpoint", conflicts_with = "budget")]
        samples: Option<u32>,
        /// Kernels per task instead of --samples: K = B / --turns (B must be a multiple of
        /// --turns). Equal budgets compare serial refinement with parallel sampling.
        #[arg(long, requires = "checkpoint")]
        budget: Option<u32>,
        /// N: refinement turns per trajectory, with --checkpoint (the paper evaluates 8).
        #[arg(long, default_value_t = 8)]
        turns: u32,
        /// Task split of --checkpoint: "heldout" (never trained on), "train" or "all".
        #[arg(long, default_value = "heldout", value_parser = crate::eval_policy_cmd::SPLITS)]
        split: String,
        /// Only these tasks (comma-separated; with --checkpoint each must be in --split).
        #[arg(long, value_delimiter = ',')]
        tasks: Vec<String>,
        /// Also write the results as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
        /// With --checkpoint: write every turn (task, trajectory, turn, prompt, response, outcome
        /// and its reason) to this file as JSON lines, to read what the policy wrote.
        #[arg(long, requires = "checkpoint")]
        transcripts: Option<PathBuf>,
        /// Execution backend: "cpu" (no GPU needed; small preset) or "cuda" (GPU preset). Default:
        /// cuda where nvidia-smi lists a GPU, else cpu.
        #[arg(long, value_parser = crate::backends::BACKENDS)]
        backend: Option<String>,
        /// Where the policy runs: "cpu" (burn NdArray), "cuda" (GPU 0) or "auto" (cuda where
        /// nvidia-smi lists a GPU). Default: the config's policy.burn.device (auto).
        #[arg(long, requires = "checkpoint", value_parser = crate::eval_policy_cmd::DEVICES)]
        device: Option<String>,
        /// Sampling temperature (default: the config's sampling.temperature, 0.9).
        #[arg(long, requires = "checkpoint")]
        temperature: Option<f64>,
        /// Maximum tokens per response (default: the config's sampling.max_new_tokens, 4096).
        #[arg(long, requires = "checkpoint")]
        max_new_tokens: Option<u32>,
        /// Base seed of --checkpoint's sampling seeds (each turn's seed derives from it, the
        /// task, the trajectory and the turn).
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// A training config (TOML) whose [sampling], rollout.prompt_budget_chars and
        /// [policy.burn] (device, max_len, seed) apply; default: the built-in defaults. The
        /// flags above override it; KEVIN__SECTION__KEY variables apply as for kevin train.
        #[arg(long, requires = "checkpoint")]
        config: Option<PathBuf>,
        /// The task suite's folder.
        #[arg(long, default_value = "tasks")]
        dir: PathBuf,
    },
    /// Benchmark the system itself.
    Bench {
        /// What to benchmark.
        #[command(subcommand)]
        what: BenchCommand,
    },
    /// Per-actor busy/idle, message counts, latencies, mailbox high-water marks and the slowest
    /// spans of a run, from its trace files and metrics.jsonl.
    Inspect {
        /// The run directory.
        run_dir: PathBuf,
        /// Print JSON instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// PNG plots over learner steps (reward, correctness, mean speedup, staleness, actor
    /// utilisation) and summary.md (config, steps, wall time, trajectories/hour, first vs last
    /// window means) from a run directory's metrics.jsonl. Unreadable lines are skipped and
    /// named; the run directory is only read, so a live run can be reported on.
    Report {
        /// The run directory (the one `kevin train` wrote, with metrics.jsonl).
        run_dir: PathBuf,
        /// Output folder for the PNGs and summary.md (default: RUN_DIR/report).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Steps in each of the first and last windows the summary compares (default: a fifth of
        /// the steps, 1 to 50).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        window: Option<u64>,
    },
    /// List the task suite (name, level, split, sizes), or show a task's first-turn prompt.
    Tasks {
        /// The task suite's folder.
        #[arg(long, default_value = "tasks", global = true)]
        dir: PathBuf,
        /// Print the suite as JSON (for tools).
        #[arg(long)]
        json: bool,
        /// `show NAME`: print the exact first-turn prompt of a task.
        #[command(subcommand)]
        show: Option<TasksCommand>,
    },
    /// Supervised warm-start: build the verified corpus, train the tokenizer, train the policy.
    Sft {
        /// What to build.
        #[command(subcommand)]
        what: SftCommand,
    },
    /// The burn policy's model: `init` writes a random-initialised checkpoint to start from.
    Policy {
        /// What to do.
        #[command(subcommand)]
        what: PolicyCommand,
    },
    /// Serve as an evaluation worker process (internal: started by kevin itself).
    #[command(hide = true)]
    Worker {
        /// Arguments of the worker.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

/// `kevin tasks` subcommands.
#[derive(Subcommand, Debug)]
pub enum TasksCommand {
    /// Print the exact first-turn prompt a policy sees for a task.
    Show {
        /// The task's name.
        name: String,
        /// Size preset shown in the prompt: "gpu" or "small".
        #[arg(long, default_value = "gpu", value_parser = ["gpu", "small"])]
        preset: String,
    },
}

/// `kevin sft` subcommands.
#[derive(Subcommand, Debug)]
pub enum SftCommand {
    /// Build the warm-start corpus (JSONL) from the train split: reference solutions, verified
    /// variants and naive kernels, and broken-then-fixed repair pairs, every kernel compiled and
    /// checked on the CPU backend. Prints counts by kind and by outcome.
    Corpus {
        /// The JSONL file to write.
        #[arg(long)]
        out: PathBuf,
        /// The task suite's folder (reference solutions in its `solutions/`).
        #[arg(long, default_value = "tasks")]
        tasks: PathBuf,
        /// Seed of the breakage sites.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// CPU worker processes (default: one per CPU core).
        #[arg(long)]
        workers: Option<usize>,
        /// Only these train tasks (comma-separated; a held-out task is an error).
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
        /// Training config whose tasks.preset and rollout.prompt_budget_chars the prompts use
        /// (default: configs/quickstart.toml when present).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Train a byte-level BPE tokenizer on a corpus and write DIR/tokenizer.json; prints bytes
    /// per token on the corpus.
    Tokenizer {
        /// The corpus (JSONL from `kevin sft corpus`).
        #[arg(long)]
        corpus: PathBuf,
        /// Vocabulary size, special tokens included.
        #[arg(long, default_value_t = 4096)]
        vocab_size: usize,
        /// Output folder.
        #[arg(long)]
        out: PathBuf,
    },
    /// Train the policy on the corpus (supervised warm start): mean NLL of each conversation's
    /// last response, prompt tokens as context only; AdamW, warm-up + cosine decay, global
    /// gradient-norm clipping; whole forms held out for validation. Writes a Hugging Face
    /// directory (config.json, model.safetensors, tokenizer.json) for `[policy.burn].checkpoint`,
    /// and sft.json (command, corpus hash, shape, losses per epoch, speed, device).
    Train(SftTrainArgs),
}

/// The flags of `kevin sft train`.
#[derive(clap::Args, Debug)]
pub struct SftTrainArgs {
    /// The corpus (JSONL from `kevin sft corpus`).
    #[arg(long)]
    pub corpus: PathBuf,
    /// The tokenizer.json (e.g. models/kevin-bpe-4096/tokenizer.json).
    #[arg(long)]
    pub tokenizer: PathBuf,
    /// Output folder.
    #[arg(long)]
    pub out: PathBuf,
    /// Start from this Hugging Face directory instead of a fresh model (the shape flags are
    /// then ignored).
    #[arg(long)]
    pub init: Option<PathBuf>,
    /// Fresh model: hidden size.
    #[arg(long, default_value_t = 256)]
    pub hidden: usize,
    /// Fresh model: decoder layers.
    #[arg(long, default_value_t = 4)]
    pub layers: usize,
    /// Fresh model: attention heads.
    #[arg(long, default_value_t = 4)]
    pub heads: usize,
    /// Fresh model: key/value heads (grouped-query attention).
    #[arg(long, default_value_t = 2)]
    pub kv_heads: usize,
    /// Fresh model: MLP width.
    #[arg(long, default_value_t = 768)]
    pub intermediate: usize,
    /// Passes over the training examples.
    #[arg(long, default_value_t = 10)]
    pub epochs: u64,
    /// Peak learning rate.
    #[arg(long, default_value_t = 1e-3)]
    pub lr: f64,
    /// Learning rate at the last step, as a fraction of --lr (cosine decay).
    #[arg(long, default_value_t = 0.1)]
    pub min_lr_ratio: f64,
    /// Linear warm-up steps (default: 5% of all steps).
    #[arg(long)]
    pub warmup_steps: Option<u64>,
    /// Padded positions (rows x longest row) per optimizer step.
    #[arg(long, default_value_t = 16384)]
    pub batch_tokens: usize,
    /// Padded positions per forward pass, to bound memory (default: --batch-tokens); the
    /// gradient does not depend on it.
    #[arg(long)]
    pub micro_batch_tokens: Option<usize>,
    /// Longest sequence, prompt + response, in tokens.
    #[arg(long, default_value_t = 2048)]
    pub max_len: usize,
    /// Longer examples: "truncate" (keep the prompt and the start of the response; dropped
    /// when the prompt alone is too long) or "drop".
    #[arg(long, default_value = "truncate", value_parser = ["truncate", "drop"])]
    pub overlong: String,
    /// Fraction of examples held out for validation, as whole forms (0: none).
    #[arg(long, default_value_t = 0.05)]
    pub val_fraction: f64,
    /// Global gradient-norm clip.
    #[arg(long, default_value_t = 1.0)]
    pub grad_clip: f64,
    /// AdamW weight decay.
    #[arg(long, default_value_t = 0.1)]
    pub weight_decay: f64,
    /// "cpu", "cuda" or "auto" (cuda where nvidia-smi lists a GPU).
    #[arg(long, default_value = "auto", value_parser = ["cpu", "cuda", "auto"])]
    pub device: String,
    /// Seed of the initial weights, the shuffles and the validation split.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Also write OUT/epoch-NNN/ after every epoch.
    #[arg(long)]
    pub save_every_epoch: bool,
    /// Stop after this many optimizer steps (a smoke run; the schedule still spans all epochs).
    #[arg(long)]
    pub max_steps: Option<u64>,
}

/// `kevin policy` subcommands.
#[derive(Subcommand, Debug)]
pub enum PolicyCommand {
    /// Write a random-initialised Hugging Face Qwen2 checkpoint directory (config.json,
    /// model.safetensors, tokenizer.json) for `[policy.burn].checkpoint`: training from scratch.
    /// The config's vocab_size is set to the tokenizer's size when it differs (and says so).
    Init {
        /// A Qwen2 config.json (hidden size, layers, heads, ...).
        #[arg(long)]
        config_json: PathBuf,
        /// The tokenizer.json the model will use (e.g. models/kevin-bpe-4096/tokenizer.json).
        #[arg(long)]
        tokenizer: PathBuf,
        /// Output folder.
        #[arg(long)]
        out: PathBuf,
        /// Seed of the random weights.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Dtype of model.safetensors: "f32" or "bf16".
        #[arg(long, default_value = "f32", value_parser = ["f32", "bf16"])]
        dtype: String,
    },
    /// Check that kevin computes the logits transformers computed for a checkpoint: DIR holds the
    /// model and `expected.safetensors` (written by `python3 tests/qwen2_parity.py --out`). Prints
    /// the largest difference through the full forward pass and through the KV cache; exits 1
    /// when either is over the bound. In f32 the bound is 1e-4, and on CUDA the matmuls are
    /// split so that burn's TF32 tensor cores keep f32 accuracy (`--tf32` measures them as they
    /// are). In bf16 kevin must be as close to transformers' f32 logits as transformers' own
    /// bf16 ones are (bound 2e-2 or that difference, whichever is larger); the difference to
    /// transformers' bf16 logits is printed too.
    Parity {
        /// The checkpoint directory with its expected.safetensors.
        #[arg(long)]
        dir: PathBuf,
        /// "cuda" (burn's CUDA backend, GPU 0) or "cpu" (NdArray, f32 only).
        #[arg(long, default_value = "cuda", value_parser = ["cuda", "cpu"])]
        device: String,
        /// The dtype kevin computes in: "f32" or "bf16".
        #[arg(long, default_value = "f32", value_parser = ["f32", "bf16"])]
        dtype: String,
        /// f32 on CUDA: leave the matmuls to burn's tensor-core kernels, which round f32
        /// operands to TF32 (shows how far that alone moves the logits).
        #[arg(long)]
        tf32: bool,
    },
}

/// The environment a `kevin bench hacks|faults` run evaluates with.
#[derive(clap::Args, Debug, Clone)]
pub struct EnvArgs {
    /// Execution backend: "cpu" (no GPU needed) or "cuda"; default cuda where nvidia-smi lists a
    /// GPU, else cpu.
    #[arg(long, value_parser = crate::backends::BACKENDS)]
    pub backend: Option<String>,
    /// The task suite's folder (reference solutions in its `solutions/`).
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
}

impl EnvArgs {
    fn deadlines(&self) -> kevin::env::Deadlines {
        kevin::env::Deadlines {
            compile_ms: self.compile_timeout_ms,
            verify_ms: self.verify_timeout_ms,
            profile_ms: self.profile_timeout_ms,
        }
    }

    fn backend(&self) -> &str {
        self.backend
            .as_deref()
            .unwrap_or_else(|| crate::backends::default_backend())
    }

    fn workers(&self) -> usize {
        self.workers
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
            .max(1)
    }

    /// The task suite and the environment, or the exit code of a one-line error.
    fn env(&self) -> Result<std::sync::Arc<dyn kevin::env::KernelEnv>, ExitCode> {
        let suite = kevin::tasks::TaskSuite::load(&self.dir)
            .map_err(|e| usage_error(format!("task suite {}: {e}", self.dir.display())))?;
        crate::backends::eval_env(
            Some(self.backend()),
            suite,
            &self.dir,
            self.workers(),
            self.deadlines(),
        )
        .map_err(failure)
    }
}

/// `kevin bench` subcommands.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// The actor pipeline's own cost with zero-latency simulated components, and async vs sync
    /// throughput with the simulated latencies of a real run.
    Pipeline {
        /// Learner steps of the zero-latency run.
        #[arg(long, default_value_t = 60)]
        steps: u64,
        /// Seconds each of the async and sync runs lasts.
        #[arg(long, default_value_t = 20.0)]
        seconds: f64,
        /// Also write the results as markdown to this file.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// The burn policy's speed: batched generation (KV cache, continuous batching, sampling) and
    /// learner steps (forward, backward, AdamW) on a random-weight Qwen2; with `--hf FILE` (the
    /// JSON of benches/hf_policy.py, run on the same machine) the ratios to transformers.
    Policy {
        /// Model shape: "qwen2-0.5b" (the issue's) or "tiny" (a smoke run).
        #[arg(long, default_value = "qwen2-0.5b")]
        shape: String,
        /// "cuda" or "cpu" (default: cuda where nvidia-smi lists a GPU).
        #[arg(long)]
        device: Option<String>,
        /// "bf16" or "f32" (the CPU runs f32).
        #[arg(long, default_value = "bf16")]
        dtype: String,
        /// Generation batch sizes, comma-separated.
        #[arg(long, default_value = "1,64", value_delimiter = ',')]
        batches: Vec<usize>,
        /// Prompt tokens per sequence.
        #[arg(long, default_value_t = 256)]
        prompt: usize,
        /// New tokens per sequence.
        #[arg(long, default_value_t = 256)]
        new_tokens: usize,
        /// Learner: sequences per step.
        #[arg(long, default_value_t = 8)]
        train_batch: usize,
        /// Learner: tokens per sequence.
        #[arg(long, default_value_t = 1024)]
        train_seq: usize,
        /// Learner: timed steps after one warm-up step (0: no learner).
        #[arg(long, default_value_t = 3)]
        train_steps: usize,
        /// The transformers peer's JSON (benches/hf_policy.py --json) to compare with.
        #[arg(long)]
        hf: Option<PathBuf>,
        /// Write the results (and the comparison) as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// The GPU harness on this machine's GPU: NVRTC compile latency, end-to-end evaluation
    /// throughput on level-1 solutions, timing repeatability of one kernel, and replacement of
    /// workers killed by illegal-address faults.
    Gpu {
        /// Seconds of the throughput run.
        #[arg(long, default_value_t = 30.0)]
        seconds: f64,
        /// Evaluations of the repeatability kernel.
        #[arg(long, default_value_t = 10)]
        repeat: usize,
        /// Task whose reference solution is evaluated repeatedly.
        #[arg(long, default_value = "softmax")]
        task: String,
        /// GPU worker processes.
        #[arg(long, default_value_t = 4)]
        workers: usize,
        /// Concurrent evaluations in the throughput run.
        #[arg(long, default_value_t = 16)]
        clients: usize,
        /// Illegal-address faults to inject.
        #[arg(long, default_value_t = 5)]
        faults: usize,
        /// The task suite's folder.
        #[arg(long, default_value = "tasks")]
        dir: PathBuf,
        /// Also write the results as markdown to this file.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// The adversarial suite (tests/data/hacks/): every known reward hack and fault must get its
    /// expected outcome on this backend, and the reference solutions of its tasks must pass. One
    /// line per case; exit status 1 on any mismatch.
    Hacks {
        /// The environment.
        #[command(flatten)]
        env: EnvArgs,
        /// Also write the results as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// A fault storm: --count evaluations mixing the adversarial suite's faulty candidates with
    /// valid reference solutions, shuffled, submitted concurrently. Reports crashes, lost and
    /// misattributed results, verdict and speedup changes of valid candidates against a clean
    /// run, worker respawns and their latency, throughput. Exit status 1 when anything was lost
    /// or misattributed or a valid verdict changed.
    Faults {
        /// The environment.
        #[command(flatten)]
        env: EnvArgs,
        /// Evaluations to submit.
        #[arg(long, default_value_t = 1000)]
        count: usize,
        /// Threads submitting at once (default: twice the workers).
        #[arg(long)]
        concurrency: Option<usize>,
        /// Share of faulty candidates among the evaluations.
        #[arg(long, default_value_t = 0.5)]
        faulty_share: f64,
        /// Seed of the shuffle.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Stop submitting after this many seconds: the evaluations in flight finish and the
        /// report covers those submitted (it says so), so a run under a time limit still reports.
        #[arg(long)]
        max_seconds: Option<f64>,
        /// Also write the figures as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Async vs sync with real components: the config trained in async mode, then in sync mode
    /// (only run.mode and replay.max_staleness change), each a `kevin train` child for the same
    /// wall-clock time, stopped by SIGINT. Reports per mode, over its window: groups and
    /// trajectories per hour, learner steps, reward and correct rate of those steps, and the busy
    /// share of each actor and of the accelerator actors together (from the trace); then the
    /// async / sync ratio of trajectories per hour.
    Modes {
        /// The config to compare (default: configs/quickstart.toml). KEVIN__* variables apply.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Wall-clock seconds each mode is measured.
        #[arg(long, default_value_t = 300.0)]
        seconds: f64,
        /// Seconds of a discarded async run first, so that neither timed run pays a fresh
        /// machine's one-time work (burn's CUDA kernels, the CUBIN cache).
        #[arg(long, default_value_t = 0.0)]
        warmup: f64,
        /// Folder for the run directories (warmup, async, sync; replaced if present).
        #[arg(long, default_value = "runs/bench-modes")]
        dir: PathBuf,
        /// Also write the results as markdown to this file.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Also write the figures as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
    },
}

fn init_logging(
    filter: &str,
    trace_file: Option<&Path>,
) -> Result<Option<kevin::telemetry::TraceGuard>, String> {
    let env_filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|f| EnvFilter::try_new(f).ok())
        .map_or_else(
            || EnvFilter::try_new(filter).map_err(|e| format!("log filter {filter:?}: {e}")),
            Ok,
        )?;
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_filter(env_filter);
    match trace_file {
        Some(path) => {
            let (chrome, guard) = kevin::telemetry::chrome_layer(path)
                .map_err(|e| format!("trace file {}: {e}", path.display()))?;
            // Per-layer filter: the trace gets every kevin span and counter whatever the log level.
            let chrome = chrome.with_filter(filter_fn(|m| m.target().starts_with("kevin")));
            tracing_subscriber::registry()
                .with(fmt)
                .with(chrome)
                .try_init()
                .map_err(|e| e.to_string())?;
            Ok(Some(guard))
        }
        None => {
            tracing_subscriber::registry()
                .with(fmt)
                .try_init()
                .map_err(|e| e.to_string())?;
            Ok(None)
        }
    }
}

/// Resolves SIGINT or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
    eprintln!("kevin: stopping (drain, checkpoint); send the signal again only if you must abandon in-flight work");
}

fn env_vars() -> Vec<(String, String)> {
    std::env::vars().collect()
}

fn usage_error(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("kevin: {msg}");
    ExitCode::from(2)
}

fn failure(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("kevin: {msg}");
    ExitCode::from(1)
}

fn cmd_train(
    cli_log: Option<String>,
    config: Option<PathBuf>,
    run_dir: Option<PathBuf>,
    max_steps: Option<u64>,
) -> ExitCode {
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
                return usage_error(format!(
                    "the default config {DEFAULT_CONFIG} is not here (run kevin from the repository root or pass --config FILE)"
                ));
            }
            p
        }
    };
    let mut config = match Config::load(Some(&path), &env_vars()) {
        Ok(c) => c,
        Err(e) => return usage_error(e),
    };
    if let Some(n) = max_steps {
        config.file.run.max_steps = n;
        config.sources.push(format!("--max-steps {n}"));
    }
    let run_dir = config.run_dir(run_dir.as_deref());
    if let Err(e) = std::fs::create_dir_all(&run_dir) {
        return failure(format!("run directory {}: {e}", run_dir.display()));
    }
    let trace = if config.telemetry.trace {
        match kevin::telemetry::session_trace_path(&run_dir) {
            Ok(p) => Some(p),
            Err(e) => return failure(format!("run directory {}: {e}", run_dir.display())),
        }
    } else {
        None
    };
    let filter = cli_log.unwrap_or_else(|| config.telemetry.log_level.clone());
    let guard = match init_logging(&filter, trace.as_deref()) {
        Ok(g) => g,
        Err(e) => return usage_error(e),
    };
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
            ExitCode::SUCCESS
        }
        Err(system::TrainError::ConfigMismatch { dir, key }) => {
            usage_error(system::TrainError::ConfigMismatch { dir, key })
        }
        Err(e) => failure(e),
    }
}

/// Warnings `kevin report` prints on stderr before pointing at summary.md for the rest.
const REPORT_WARNINGS_SHOWN: usize = 10;

fn cmd_report(run_dir: &Path, out: Option<PathBuf>, window: Option<u64>) -> ExitCode {
    let opts = crate::report::ReportOptions {
        out,
        window: window.map(|w| usize::try_from(w).unwrap_or(usize::MAX)),
    };
    match crate::report::write_report(run_dir, &opts) {
        Ok(r) => {
            if !r.warnings.is_empty() {
                eprintln!("kevin report: {} warning(s):", r.warnings.len());
                for w in r.warnings.iter().take(REPORT_WARNINGS_SHOWN) {
                    eprintln!("  {w}");
                }
                if r.warnings.len() > REPORT_WARNINGS_SHOWN {
                    eprintln!(
                        "  ... and {} more (listed in {})",
                        r.warnings.len() - REPORT_WARNINGS_SHOWN,
                        r.summary.display()
                    );
                }
            }
            println!(
                "kevin report: {} learner steps, {} plots in {}",
                r.steps,
                r.plots.len(),
                r.out.display()
            );
            for p in r.plots.iter().chain([&r.summary]) {
                println!("{}", p.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => failure(e),
    }
}

fn cmd_inspect(run_dir: &Path, json: bool) -> ExitCode {
    match kevin::telemetry::inspect(run_dir) {
        Ok(report) => {
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&report).expect("report serialises")
                );
            } else {
                print!("{report}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => failure(e),
    }
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
    match cli.command {
        Command::Train {
            config,
            run_dir,
            max_steps,
        } => cmd_train(cli.log, config, run_dir, max_steps),
        Command::Inspect { run_dir, json } => cmd_inspect(&run_dir, json),
        Command::Report {
            run_dir,
            out,
            window,
        } => cmd_report(&run_dir, out, window),
        Command::Bench {
            what:
                BenchCommand::Pipeline {
                    steps,
                    seconds,
                    out,
                },
        } => {
            if let Err(e) = init_logging(cli.log.as_deref().unwrap_or("warn"), None) {
                return usage_error(e);
            }
            match crate::bench::pipeline(steps, seconds, out.as_deref()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => failure(e),
            }
        }
        Command::Bench {
            what:
                BenchCommand::Gpu {
                    seconds,
                    repeat,
                    task,
                    workers,
                    clients,
                    faults,
                    dir,
                    out,
                },
        } => {
            if let Err(e) = init_logging(cli.log.as_deref().unwrap_or("warn"), None) {
                return usage_error(e);
            }
            let args = crate::bench_gpu::GpuBenchArgs {
                dir,
                seconds,
                repeat,
                task,
                workers,
                clients,
                faults,
                out,
            };
            match crate::bench_gpu::run(&args) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => failure(e),
            }
        }
        Command::Bench {
            what:
                BenchCommand::Policy {
                    shape,
                    device,
                    dtype,
                    batches,
                    prompt,
                    new_tokens,
                    train_batch,
                    train_seq,
                    train_steps,
                    hf,
                    json,
                },
        } => {
            if let Err(e) = init_logging(cli.log.as_deref().unwrap_or("warn"), None) {
                return usage_error(e);
            }
            let shape = match kevin_policy::bench::Shape::parse(&shape) {
                Ok(s) => s,
                Err(e) => return usage_error(e),
            };
            let args = kevin_policy::bench::BenchArgs {
                shape,
                batches,
                prompt,
                new_tokens,
                train_batch,
                train_seq,
                train_steps,
            };
            let device = device.unwrap_or_else(|| kevin::machine::default_backend().to_string());
            match crate::bench_policy::run(&args, &device, &dtype, hf.as_deref(), json.as_deref()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => failure(e),
            }
        }
        Command::Bench {
            what: BenchCommand::Hacks { env, json },
        } => {
            if let Err(e) = init_logging(cli.log.as_deref().unwrap_or("error"), None) {
                return usage_error(e);
            }
            let kernel_env = match env.env() {
                Ok(e) => e,
                Err(code) => return code,
            };
            let result = crate::hacks_cmd::main(
                kernel_env,
                &env.hacks,
                &env.dir,
                env.backend(),
                env.workers(),
                json.as_deref(),
            );
            match result {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::from(1),
                Err(e) => failure(e),
            }
        }
        Command::Bench {
            what:
                BenchCommand::Faults {
                    env,
                    count,
                    concurrency,
                    faulty_share,
                    seed,
                    max_seconds,
                    json,
                },
        } => {
            if let Err(e) = init_logging(cli.log.as_deref().unwrap_or("error"), None) {
                return usage_error(e);
            }
            if !(0.0..=1.0).contains(&faulty_share) {
                return usage_error(format!(
                    "--faulty-share {faulty_share}: must be between 0 and 1"
                ));
            }
            let kernel_env = match env.env() {
                Ok(e) => e,
                Err(code) => return code,
            };
            let opts = crate::faults_bench::FaultOptions {
                count,
                concurrency: concurrency.unwrap_or(2 * env.workers()).max(1),
                seed,
                faulty_share,
                max_seconds,
            };
            let result = crate::faults_bench::main(
                kernel_env,
                &env.hacks,
                &env.dir,
                env.backend(),
                env.deadlines(),
                &opts,
                json.as_deref(),
            );
            match result {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::from(1),
                Err(e) => failure(e),
            }
        }
        Command::Bench {
            what:
                BenchCommand::Modes {
                    config,
                    seconds,
                    warmup,
                    dir,
                    out,
                    json,
                },
        } => {
            let args = crate::modes_bench::ModesArgs {
                config: config.unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG)),
                seconds,
                warmup,
                dir,
                out,
                json,
            };
            match crate::modes_bench::run(&args) {
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => failure(e),
            }
        }
        Command::Eval {
            kernels,
            checkpoint,
            samples,
            budget,
            turns,
            split,
            tasks,
            json,
            transcripts,
            backend,
            device,
            temperature,
            max_new_tokens,
            seed,
            config,
            dir,
        } => {
            if let Err(e) = init_logging(cli.log.as_deref().unwrap_or("warn"), None) {
                return usage_error(e);
            }
            if let Some(checkpoint) = checkpoint {
                let args = crate::eval_policy_cmd::PolicyEvalArgs {
                    checkpoint,
                    samples,
                    budget,
                    turns,
                    split,
                    tasks,
                    backend,
                    device,
                    temperature,
                    max_new_tokens,
                    seed,
                    json,
                    transcripts,
                    config,
                    dir,
                };
                return match crate::eval_policy_cmd::main(&args, &env_vars()) {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(crate::eval_policy_cmd::CmdError::Usage(e)) => usage_error(e),
                    Err(crate::eval_policy_cmd::CmdError::Failure(e)) => failure(e),
                };
            }
            // clap's group makes one of --kernels and --checkpoint present.
            let Some(kernels) = kernels else {
                return usage_error("give --kernels DIR or --checkpoint DIR");
            };
            let suite = match kevin::tasks::TaskSuite::load(&dir) {
                Ok(s) => s,
                Err(e) => return usage_error(format!("task suite {}: {e}", dir.display())),
            };
            let parallel = std::thread::available_parallelism().map_or(1, |n| n.get());
            let env = match crate::backends::eval_env(
                backend.as_deref(),
                suite.clone(),
                &dir,
                parallel,
                kevin::env::Deadlines::default(),
            ) {
                Ok(env) => env,
                Err(e) => return failure(e),
            };
            match crate::eval_cmd::main(env, &suite, &kernels, &tasks, parallel, json.as_deref()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => failure(e),
            }
        }
        Command::Tasks { dir, json, show } => {
            let result = match show {
                None => crate::tasks_cmd::list(&dir, json),
                Some(TasksCommand::Show { name, preset }) => {
                    let preset = if preset == "small" {
                        kevin::tasks::Preset::Small
                    } else {
                        kevin::tasks::Preset::Gpu
                    };
                    crate::tasks_cmd::show(&dir, &name, preset)
                }
            };
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => failure(e),
            }
        }
        Command::Sft {
            what:
                SftCommand::Corpus {
                    out,
                    tasks,
                    seed,
                    workers,
                    only,
                    config,
                },
        } => {
            // Workers killed by broken kernels are expected here: no warning per respawn.
            if let Err(e) = init_logging(cli.log.as_deref().unwrap_or("error"), None) {
                return usage_error(e);
            }
            let config = config.or_else(|| {
                let p = PathBuf::from(DEFAULT_CONFIG);
                p.exists().then_some(p)
            });
            let args = crate::sft_cmd::CorpusArgs {
                out,
                tasks,
                seed,
                workers: workers
                    .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
                    .max(1),
                only,
                config,
            };
            match crate::sft_cmd::corpus_main(&args) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => failure(e),
            }
        }
        Command::Sft {
            what:
                SftCommand::Tokenizer {
                    corpus,
                    vocab_size,
                    out,
                },
        } => match crate::sft_cmd::tokenizer_main(&corpus, vocab_size, &out) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => failure(e),
        },
        Command::Sft {
            what: SftCommand::Train(args),
        } => match crate::sft_cmd::train_main(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => failure(e),
        },
        Command::Policy {
            what:
                PolicyCommand::Init {
                    config_json,
                    tokenizer,
                    out,
                    seed,
                    dtype,
                },
        } => {
            let dtype = if dtype == "bf16" {
                kevin_policy::SaveDtype::Bf16
            } else {
                kevin_policy::SaveDtype::F32
            };
            match kevin_policy::runtime::init_checkpoint(
                &config_json,
                &tokenizer,
                &out,
                seed,
                dtype,
            ) {
                Ok(report) => {
                    if let Some(old) = report.vocab_changed_from {
                        println!(
                            "vocab_size {old} of {} set to {}, the size of {}",
                            config_json.display(),
                            report.config.vocab_size,
                            tokenizer.display()
                        );
                    }
                    println!(
                        "wrote {} (random Qwen2: {} parameters, {} layers, hidden {}, seed {seed})",
                        out.display(),
                        report.parameters,
                        report.config.num_hidden_layers,
                        report.config.hidden_size
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => failure(e),
            }
        }
        Command::Policy {
            what:
                PolicyCommand::Parity {
                    dir,
                    device,
                    dtype,
                    tf32,
                },
        } => match kevin_policy::parity::check_named(&dir, &device, &dtype, tf32) {
            Ok(p) => {
                let rounding = match p.to_f32 {
                    Some((forward, extend)) => format!(
                        "; kevin vs transformers' f32 model: forward {forward:.3e}, kv-cache \
                         {extend:.3e} (transformers' own {dtype} vs f32: {:.3e})",
                        p.dtype_rounding
                    ),
                    None => String::new(),
                };
                println!(
                    "{} on {device} {dtype}{}: max |kevin - transformers| forward {:.3e}, kv-cache {:.3e}{rounding}; bound {:.1e}: {}",
                    dir.display(),
                    if tf32 { " (tf32)" } else { "" },
                    p.forward,
                    p.extend,
                    p.bound,
                    if p.holds() { "parity holds" } else { "PARITY FAILS" }
                );
                if p.holds() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                }
            }
            Err(e) => failure(e),
        },
        // main() normally takes `kevin worker ...` before clap; this is the same worker reached
        // through clap (e.g. with a global flag before the subcommand).
        Command::Worker { args } => {
            ExitCode::from(kevin::roles::child_main_from_args(&args).clamp(0, 255) as u8)
        }
    }
}
