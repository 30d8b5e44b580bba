//! `kevin sft corpus`, `kevin sft repairs`, `kevin sft tokenizer` and `kevin sft train`: the
//! supervised warm-start corpus (built and verified on the CPU backend, see `kevin::corpus`),
//! repair pairs from a training run's own turns (`kevin::corpus::own`), the byte-level BPE
//! tokenizer trained on a corpus (`kevin_policy::tokenizer`), and the policy trained on it
//! (`kevin_policy::sft`), with progress on stderr.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::Subcommand;

use kevin::config::Config;
use kevin::corpus::{self, CorpusOptions, CorpusStats};
use kevin::env::Deadlines;
use kevin::tasks::TaskSuite;
use kevin_policy::chat;
use kevin_policy::tokenizer::{Tokenizer, SPECIAL_TOKENS};

use super::{failure, workers_or_cores, write_json, CmdResult, DEFAULT_CONFIG};

/// Supervised warm-start: build the verified corpus, train the tokenizer, train the policy.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// What to build.
    #[command(subcommand)]
    pub what: SftCommand,
}

/// `kevin sft` subcommands.
#[derive(Subcommand, Debug)]
pub enum SftCommand {
    /// Build the warm-start corpus (JSONL) from the train split: reference solutions, verified
    /// variants and naive kernels, and broken-then-fixed repair pairs, every kernel compiled and
    /// checked on the CPU backend. Prints counts by kind and by outcome.
    Corpus(CorpusArgs),
    /// Build repair pairs (corpus JSONL) from training runs' own turns: each failed turn with a
    /// next turn, the prompt the rollout built over it (the attempt and its real feedback), and
    /// the fastest kernel the policy got right for that task (its own group's when there is
    /// one). Nothing is evaluated again. Append the file to a corpus for `kevin sft train`.
    Repairs(RepairsArgs),
    /// Train a byte-level BPE tokenizer on a corpus and write DIR/tokenizer.json; prints bytes
    /// per token on the corpus.
    Tokenizer(TokenizerArgs),
    /// Train the policy on the corpus (supervised warm start): mean NLL of each conversation's
    /// last response, prompt tokens as context only; AdamW, warm-up + cosine decay, global
    /// gradient-norm clipping; whole forms held out for validation. Writes a Hugging Face
    /// directory (config.json, model.safetensors, tokenizer.json) for `[policy.burn].checkpoint`,
    /// and sft.json (command, corpus hash, shape, losses per epoch, speed, device).
    Train(TrainArgs),
}

/// The flags of `kevin sft corpus`.
#[derive(clap::Args, Debug, Clone)]
pub struct CorpusArgs {
    /// The JSONL file to write.
    #[arg(long)]
    pub out: PathBuf,
    /// The task suite's folder (reference solutions in its `solutions/`), or several joined by `:`.
    #[arg(long, default_value = "tasks")]
    pub dir: PathBuf,
    /// Seed of the breakage sites.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// CPU worker processes, and evaluations in flight (default: one per CPU core).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Only these train tasks (comma-separated; a held-out task is an error; default: all).
    #[arg(long, value_delimiter = ',')]
    pub tasks: Vec<String>,
    /// At most this many breakages (repair candidates) evaluated per task, drawn by --seed
    /// (default: all, about six per form). Every verified answer is kept either way; over
    /// thousands of generated tasks a small cap spends the evaluations on more programs.
    #[arg(long)]
    pub breakages_per_task: Option<usize>,
    /// Multi-turn chains per task: failed attempts (the repairs' broken kernels, a response cut
    /// off inside its block) with their real feedback, then the fix (0: none). No evaluation
    /// is added.
    #[arg(long, default_value_t = 2)]
    pub chains_per_task: usize,
    /// The longest chain, in turns (at least 3).
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u64).range(3..=64))]
    pub chain_max_turns: u64,
    /// Training config whose tasks.preset and rollout.prompt_budget_chars the prompts use
    /// (default: configs/quickstart.toml when present).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Also write the counts as JSON to this file, with the command, the seed and, for each folder
    /// from `kevin tasks generate`, its seed and fingerprint.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// The flags of `kevin sft repairs`.
#[derive(clap::Args, Debug)]
pub struct RepairsArgs {
    /// A run directory (its episodes.jsonl and the parts rotated from it), an episodes file
    /// (plain or .gz), or a `kevin eval --transcripts` file of training tasks (`--split
    /// train`); repeat the flag for several.
    #[arg(long = "episodes", required = true)]
    pub episodes: Vec<PathBuf>,
    /// A corpus (`kevin sft corpus` on the same tasks) whose verified one-turn kernels answer
    /// the failures of tasks the policy never got right (otherwise those have no pair); repeat
    /// the flag for several.
    #[arg(long = "answers")]
    pub answers: Vec<PathBuf>,
    /// The JSONL file to write.
    #[arg(long)]
    pub out: PathBuf,
    /// The task suite's folder, or several joined by `:`: a turn of one of its held-out tasks
    /// is an error.
    #[arg(long, default_value = "tasks")]
    pub dir: PathBuf,
    /// At most this many pairs per task, drawn by --seed.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..))]
    pub per_task: u64,
    /// Chooses the pairs of a task that has more than --per-task.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Also write the counts as JSON to this file, with the command and the inputs.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// The flags of `kevin sft tokenizer`.
#[derive(clap::Args, Debug)]
pub struct TokenizerArgs {
    /// The corpus (JSONL from `kevin sft corpus`).
    #[arg(long)]
    pub corpus: PathBuf,
    /// Vocabulary size, special tokens included.
    #[arg(long, default_value_t = 4096)]
    pub vocab_size: usize,
    /// Output folder.
    #[arg(long)]
    pub out: PathBuf,
}

/// The flags of `kevin sft train`.
#[derive(clap::Args, Debug)]
pub struct TrainArgs {
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
    /// Drop examples whose response is longer than this many tokens: the configs' sampling
    /// limit (`sampling.max_new_tokens`, 1024), so that no target is an answer the policy
    /// could never finish. 0 keeps every example (before 2026-12-06, every run did).
    #[arg(long, default_value_t = 1024)]
    pub max_response_tokens: usize,
    /// Fraction of examples held out for validation (0: none), as whole tasks or forms
    /// (`--val-split`).
    #[arg(long, default_value_t = 0.05)]
    pub val_fraction: f64,
    /// What validation holds out whole: "task" (the default since 2026-12-06: every example
    /// of some training programs, so validation loss measures programs never seen, as the
    /// held-out evaluation does) or "form" (kinds of kernel or breakage never seen: the split
    /// of before).
    #[arg(long, default_value = "task", value_parser = ["task", "form"])]
    pub val_split: String,
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
    /// The parameters' dtype while training: "f32", or "bf16" (CUDA only: bf16 weights and
    /// activations on the tensor cores, f32 master weights and AdamW moments). The checkpoint
    /// holds the f32 weights either way.
    #[arg(long, default_value = "f32", value_parser = ["f32", "bf16"])]
    pub dtype: String,
    /// Also write OUT/epoch-NNN/ after every epoch.
    #[arg(long)]
    pub save_every_epoch: bool,
    /// Stop after this many optimizer steps (a smoke run; the schedule still spans all epochs).
    #[arg(long)]
    pub max_steps: Option<u64>,
}

/// Runs the subcommand.
pub fn run(args: Args) -> CmdResult {
    match args.what {
        SftCommand::Corpus(a) => corpus_main(&a),
        SftCommand::Repairs(a) => repairs_main(&a),
        SftCommand::Tokenizer(a) => tokenizer_main(&a.corpus, a.vocab_size, &a.out),
        SftCommand::Train(a) => train_main(&a),
    }
    .map_err(failure)?;
    Ok(ExitCode::SUCCESS)
}

/// Builds the corpus, writes it, prints its counts; `Err` is a one-line message.
pub fn corpus_main(args: &CorpusArgs) -> Result<(), String> {
    let started = Instant::now();
    let workers = workers_or_cores(args.workers);
    let config_path = args.config.clone().or_else(|| {
        let p = PathBuf::from(DEFAULT_CONFIG);
        p.exists().then_some(p)
    });
    let config = match &config_path {
        Some(p) => Config::load(Some(p), &[]).map_err(|e| e.to_string())?,
        None => Config::load(None, &[]).map_err(|e| e.to_string())?,
    };
    let suite = TaskSuite::load(&args.dir)
        .map_err(|e| format!("task suite {}: {e}", args.dir.display()))?;
    // Generous verify deadline: a broken kernel that hangs costs this much, a correct one needs
    // well under a second on the small preset.
    let deadlines = Deadlines {
        verify_ms: 10_000,
        ..Deadlines::default()
    };
    let env = super::backends::eval_env(Some("cpu"), suite.clone(), &args.dir, workers, deadlines)?;
    eprintln!("kevin sft corpus: {}", env.describe());
    let opts = CorpusOptions {
        preset: config.tasks.preset,
        seed: args.seed,
        prompt_budget_chars: config.rollout.prompt_budget_chars as usize,
        parallel: workers,
        only: args.tasks.clone(),
        breakages_per_task: args.breakages_per_task,
        chains_per_task: args.chains_per_task,
        chain_max_turns: args.chain_max_turns as usize,
    };
    let line = super::ProgressLine::default();
    let progress = |p: corpus::Progress<'_>| {
        let text = format!(
            "[{}/{}] {:.0} s, last: {:<28} {:<14}",
            p.done,
            p.total,
            started.elapsed().as_secs_f64(),
            p.task,
            p.outcome
        );
        line.show(p.done, p.total, &text);
    };
    let built = corpus::build(&suite, env.as_ref(), &opts, &progress);
    line.finish();
    let built = built.map_err(|e| e.to_string())?;
    if let Some(dir) = args.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    corpus::write_jsonl(&args.out, &built.examples).map_err(|e| e.to_string())?;
    print!(
        "{}",
        render_stats(&built.stats, &args.out, started.elapsed().as_secs_f64())
    );
    if let Some(path) = &args.json {
        // The counts, and what rebuilds the corpus: the command, the seed and, for a folder of
        // generated tasks, the generation's seed, naming, shapes and fingerprint (its
        // `generated.json`; one written before they were recorded had fixed names and simple
        // shapes).
        let mut record = serde_json::to_value(&built.stats).map_err(|e| e.to_string())?;
        let generated: Vec<_> = kevin::tasks::suite_dirs(&args.dir)
            .into_iter()
            .filter_map(|d| {
                let text = std::fs::read_to_string(d.join("generated.json")).ok()?;
                let g = serde_json::from_str::<serde_json::Value>(&text).ok()?;
                Some(serde_json::json!({
                    "dir": d.display().to_string(), "seed": g["seed"], "fingerprint": g["fingerprint"],
                    "naming": g.get("naming").cloned().unwrap_or_else(|| "fixed".into()),
                    "shapes": g.get("shapes").cloned().unwrap_or_else(|| "simple".into())
                }))
            })
            .collect();
        record["command"] = std::env::args().collect::<Vec<_>>().join(" ").into();
        record["dir"] = args.dir.display().to_string().into();
        record["seed"] = args.seed.into();
        record["breakages_per_task"] = args.breakages_per_task.into();
        record["chains_per_task"] = args.chains_per_task.into();
        record["chain_max_turns"] = args.chain_max_turns.into();
        record["generated"] = generated.into();
        write_json(path, &record)?;
    }
    Ok(())
}

/// Builds repair pairs from runs' episodes, writes them, prints their counts; `Err` is a
/// one-line message.
pub fn repairs_main(args: &RepairsArgs) -> Result<(), String> {
    let suite = TaskSuite::load(&args.dir)
        .map_err(|e| format!("task suite {}: {e}", args.dir.display()))?;
    let held_out = suite
        .split(kevin::tasks::Split::Heldout)
        .map(|t| t.name.clone())
        .collect();
    let mut turns = Vec::new();
    for (source, path) in args.episodes.iter().enumerate() {
        let (file, text) = if path.is_dir() {
            let live = path.join("episodes.jsonl");
            let text = kevin::telemetry::files::read_rotated(&live).map_err(|e| {
                format!(
                    "{}: {e} (a run directory of `kevin train` with telemetry.episodes on)",
                    live.display()
                )
            })?;
            (live, text)
        } else {
            let text = kevin::telemetry::files::read_text(path)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            (path.clone(), text)
        };
        turns.extend(corpus::own::parse_episodes(
            source,
            &file.display().to_string(),
            &text,
        )?);
    }
    // All answer files as one corpus, in flag order: a task's first verified kernel answers it.
    let mut answers = Vec::new();
    for path in &args.answers {
        answers.extend(corpus::read_jsonl(path)?);
    }
    let fallback = corpus::own::corpus_answers(&answers);
    let opts = corpus::own::OwnRepairOptions {
        per_task: args.per_task as usize,
        seed: args.seed,
        fallback,
    };
    let (examples, stats) = corpus::own::own_repairs(&turns, &held_out, &opts)?;
    if let Some(dir) = args.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    corpus::write_jsonl(&args.out, &examples).map_err(|e| e.to_string())?;
    let pairs: usize = stats.pairs.values().sum();
    let kinds = stats
        .pairs
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ");
    println!(
        "wrote {}: {pairs} repair pairs over {} of {} tasks ({} answered from the failed turn's own group, {} from --answers)",
        args.out.display(),
        stats.tasks_with_pairs,
        stats.tasks,
        stats.answered_in_group,
        stats.answered_from_fallback
    );
    println!("  failed turns: {kinds}");
    println!(
        "  from {} turns: {} failed turns with a next turn, {} without an answer (the policy never got the task right, and --answers has none), {} repeating an earlier failed response",
        stats.turns, stats.failures_followed, stats.without_answer, stats.repeated
    );
    if let Some(path) = &args.json {
        let mut record = serde_json::to_value(&stats).map_err(|e| e.to_string())?;
        record["command"] = std::env::args().collect::<Vec<_>>().join(" ").into();
        let shown = |paths: &[PathBuf]| -> serde_json::Value {
            paths.iter().map(|p| p.display().to_string()).collect()
        };
        record["episodes"] = shown(&args.episodes);
        record["answers"] = shown(&args.answers);
        record["per_task"] = args.per_task.into();
        record["seed"] = args.seed.into();
        write_json(path, &record)?;
    }
    Ok(())
}

/// The counts of a build, as printed.
pub fn render_stats(s: &CorpusStats, out: &Path, seconds: f64) -> String {
    let list = |m: &std::collections::BTreeMap<String, usize>| {
        m.iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let total: usize = s.by_kind.values().sum();
    let mut text = format!(
        "wrote {total} examples to {}\nby kind: {}\nturn outcomes: {}\nrepairs by breakage: {}\n\
         tasks: {}; characters: {}; candidates evaluated: {}; breakages dropped: {} still correct, {} with another outcome than intended; {:.0} s\n",
        out.display(),
        list(&s.by_kind),
        list(&s.by_outcome),
        list(&s.by_breakage),
        s.tasks,
        s.chars,
        s.evaluated,
        s.harmless_breakages,
        s.unexpected_breakages,
        seconds
    );
    if !s.dropped_variants.is_empty() {
        text += &format!(
            "variants that were not correct (dropped): {}\n",
            s.dropped_variants.join(", ")
        );
    }
    if !s.unwritten.is_empty() {
        let shown: Vec<&str> = s.unwritten.iter().take(8).map(String::as_str).collect();
        text += &format!(
            "tasks with no kernel to learn from (no reference, outside the naive writer's shapes): {}: {}{}\n",
            s.unwritten.len(),
            shown.join(", "),
            if s.unwritten.len() > shown.len() { ", ... (all in --json)" } else { "" }
        );
    }
    text
}

/// Trains a tokenizer of `vocab_size` tokens on the corpus at `corpus_path` (every turn as its
/// chat training text), writes `out_dir/tokenizer.json`, prints bytes per token on the corpus.
pub fn tokenizer_main(corpus_path: &Path, vocab_size: usize, out_dir: &Path) -> Result<(), String> {
    let started = Instant::now();
    let examples = corpus::read_jsonl(corpus_path)?;
    if examples.is_empty() {
        return Err(format!("{}: no examples", corpus_path.display()));
    }
    let texts: Vec<String> = examples
        .iter()
        .flat_map(|e| e.turns.iter())
        .map(|t| chat::training_text(None, &t.prompt, &t.response))
        .collect();
    let tok = Tokenizer::train_bpe(texts.iter(), vocab_size, &SPECIAL_TOKENS)
        .map_err(|e| e.to_string())?;
    std::fs::create_dir_all(out_dir).map_err(|e| format!("{}: {e}", out_dir.display()))?;
    let path = out_dir.join("tokenizer.json");
    tok.save(&path).map_err(|e| e.to_string())?;
    let (mut bytes, mut tokens) = (0usize, 0usize);
    for t in &texts {
        bytes += t.len();
        tokens += tok.encode(t).map_err(|e| e.to_string())?.len();
    }
    let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    if tok.vocab_size() < vocab_size {
        // BPE merges only inside pre-tokenized words: once every word seen twice is one token,
        // there is nothing left to merge.
        println!(
            "the vocabulary stopped at {} of the {vocab_size} tokens asked: no pair occurs twice any more",
            tok.vocab_size()
        );
    }
    println!(
        "wrote {} ({} tokens, {size} bytes); corpus: {} texts, {bytes} bytes, {tokens} tokens, {:.2} bytes/token; {:.1} s",
        path.display(),
        tok.vocab_size(),
        texts.len(),
        bytes as f64 / tokens.max(1) as f64,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// How often `kevin sft train` reports progress.
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// `kevin sft train`: trains, prints progress every few seconds and a line per epoch on stderr,
/// then what was written on stdout.
pub fn train_main(a: &TrainArgs) -> Result<(), String> {
    use kevin_policy::sft::run::{self, ModelShape, SftArgs};
    use kevin_policy::sft::Overlong;
    let device = match a.device.as_str() {
        "cpu" => kevin::config::BurnDevice::Cpu,
        "cuda" => kevin::config::BurnDevice::Cuda,
        _ => kevin::config::BurnDevice::Auto,
    };
    let args = SftArgs {
        corpus: a.corpus.clone(),
        tokenizer: a.tokenizer.clone(),
        out: a.out.clone(),
        init: a.init.clone(),
        shape: ModelShape {
            hidden: a.hidden,
            layers: a.layers,
            heads: a.heads,
            kv_heads: a.kv_heads,
            intermediate: a.intermediate,
        },
        epochs: a.epochs,
        lr: a.lr,
        min_lr_ratio: a.min_lr_ratio,
        warmup_steps: a.warmup_steps,
        batch_tokens: a.batch_tokens,
        micro_batch_tokens: a.micro_batch_tokens,
        max_len: a.max_len,
        overlong: if a.overlong == "drop" {
            Overlong::Drop
        } else {
            Overlong::Truncate
        },
        max_response: (a.max_response_tokens > 0).then_some(a.max_response_tokens),
        val_fraction: a.val_fraction,
        // clap admits only the two names.
        val_split: kevin::corpus::split::SplitBy::from_name(&a.val_split).unwrap_or_default(),
        grad_clip: a.grad_clip,
        weight_decay: a.weight_decay,
        seed: a.seed,
        dtype: run::SftDtype::parse(&a.dtype)?,
        save_every_epoch: a.save_every_epoch,
        max_steps: a.max_steps,
        command: std::env::args().collect(),
    };
    let mut last = Instant::now();
    let mut progress = |p: &run::Progress| {
        if last.elapsed() < PROGRESS_EVERY && p.step != p.total_steps {
            return;
        }
        last = Instant::now();
        eprintln!(
            "epoch {}/{} step {}/{} loss {:.4} lr {:.2e} {:.0} tokens/s {:.0} s, ETA {:.0} s",
            p.epoch,
            p.epochs,
            p.step,
            p.total_steps,
            p.loss,
            p.lr,
            p.tokens_per_s,
            p.elapsed_s,
            p.eta_s
        );
    };
    let mut epoch_done = |e: &run::EpochRecord| {
        let val = e
            .val_loss
            .map_or_else(|| "-".to_string(), |v| format!("{v:.4}"));
        eprintln!(
            "epoch {} done: train loss {:.4}, val loss {val}, {} steps, {:.0} tokens/s, padding {:.1}%, {:.1} s",
            e.epoch,
            e.train_loss,
            e.steps,
            e.tokens_per_s,
            100.0 * e.padding,
            e.seconds
        );
    };
    let r = run::run_on(device, &args, &mut progress, &mut epoch_done)?;
    let c = &r.corpus;
    println!(
        "wrote {} (Qwen2 {} parameters: {} layers, hidden {}, vocab {}; device {}, trained in {})",
        a.out.display(),
        r.parameters,
        r.model.num_hidden_layers,
        r.model.hidden_size,
        r.model.vocab_size,
        r.device,
        r.dtype
    );
    println!(
        "corpus {}: {} examples, {} train, {} validation (held-out {}s: {}); {} truncated, {} dropped for length, {} for a response over --max-response-tokens",
        c.path,
        c.examples,
        c.train,
        c.validation,
        c.split_by,
        match (c.held_out_forms.len(), c.held_out_tasks.len()) {
            (0, 0) => "none".to_string(),
            (_, 0) => c.held_out_forms.join(", "),
            (_, n) if n <= 8 => c.held_out_tasks.join(", "),
            (_, n) => format!("{n}, listed in sft.json"),
        },
        c.truncated,
        c.dropped,
        c.long_responses
    );
    if let Some(e) = r.epochs.last() {
        let val = e
            .val_loss
            .map_or_else(|| "-".to_string(), |v| format!("{v:.4}"));
        println!(
            "{} steps{}; last epoch: train loss {:.4}, val loss {val}; {:.1} s",
            r.steps,
            if r.stopped_early {
                " (stopped by --max-steps)"
            } else {
                ""
            },
            e.train_loss,
            r.wall_s
        );
    }
    Ok(())
}
