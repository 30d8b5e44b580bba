//! `kevin sft train` as a library call: read the corpus, split it by form, tokenise it, build or
//! open the model, train for the given epochs with validation after each, and write a Hugging
//! Face directory (config.json, model.safetensors in f32, tokenizer.json) with `sft.json`, the
//! record of how it was made. The directory is what `kevin policy init` writes, trained: it opens
//! as `[policy.burn].checkpoint` and in transformers.

use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::module::Module;
use burn::tensor::backend::{AutodiffBackend, Backend};
use kevin::config::BurnDevice;
use kevin::corpus::{self, split::SplitBy};
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::{epoch_batches, tokenize, Overlong, SftConfig, SftExample, SftTrainer};
use crate::burn_learner::{open_model, TOKENIZER_FILE};
use crate::checkpoint::{self, SaveDtype};
use crate::optim::AdamWSettings;
use crate::qwen2::{Qwen2, Qwen2Config};
use crate::runtime::{uses_cuda, CpuTrain, CudaTrain, CudaTrainBf16};
use crate::tokenizer::{Tokenizer, ENDOFTEXT, IM_END};

/// The record written next to the weights.
pub const RECORD_FILE: &str = "sft.json";

/// The shape of a fresh model (ignored with `init`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ModelShape {
    /// hidden_size.
    pub hidden: usize,
    /// num_hidden_layers.
    pub layers: usize,
    /// num_attention_heads.
    pub heads: usize,
    /// num_key_value_heads.
    pub kv_heads: usize,
    /// intermediate_size.
    pub intermediate: usize,
}

/// The parameters' dtype while training (`--dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SftDtype {
    /// f32 weights, gradients and AdamW state.
    F32,
    /// bf16 weights and activations (the forward and backward on the tensor cores), f32 master
    /// weights and AdamW moments ([`crate::optim::AdamW`]); the loss in f32. CUDA only.
    Bf16,
}

impl SftDtype {
    /// "f32" or "bf16".
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "f32" => Ok(SftDtype::F32),
            "bf16" => Ok(SftDtype::Bf16),
            other => Err(format!("--dtype {other}: expected f32 or bf16")),
        }
    }
}

/// Everything `kevin sft train` was asked.
#[derive(Debug, Clone, Serialize)]
pub struct SftArgs {
    /// The corpus (JSONL of `kevin sft corpus`).
    pub corpus: PathBuf,
    /// tokenizer.json.
    pub tokenizer: PathBuf,
    /// Output directory.
    pub out: PathBuf,
    /// Start from this Hugging Face directory instead of a fresh model.
    pub init: Option<PathBuf>,
    /// Shape of a fresh model.
    pub shape: ModelShape,
    /// Passes over the training examples.
    pub epochs: u64,
    /// Peak learning rate.
    pub lr: f64,
    /// Final learning rate as a fraction of `lr`.
    pub min_lr_ratio: f64,
    /// Warm-up steps (default: 5% of all steps).
    pub warmup_steps: Option<u64>,
    /// Padded positions per optimizer step.
    pub batch_tokens: usize,
    /// Padded positions per forward pass (default: `batch_tokens`).
    pub micro_batch_tokens: Option<usize>,
    /// Longest sequence, prompt + response.
    pub max_len: usize,
    /// What happens to longer examples.
    pub overlong: Overlong,
    /// Drop examples whose response is longer than this many tokens (the sampler's
    /// `max_new_tokens`: an answer the policy could not finish); `None` keeps them.
    pub max_response: Option<usize>,
    /// Fraction of examples held out for validation, as whole tasks or forms (`val_split`).
    pub val_fraction: f64,
    /// What validation holds out whole: tasks (the default) or forms.
    pub val_split: SplitBy,
    /// Global gradient-norm clip.
    pub grad_clip: f64,
    /// AdamW's decoupled weight decay.
    pub weight_decay: f64,
    /// Seed of the initial weights, the shuffles and the split.
    pub seed: u64,
    /// The parameters' dtype while training: f32, or bf16 with f32 master weights (CUDA only).
    /// Checkpoints hold the f32 weights either way.
    pub dtype: SftDtype,
    /// Also write `out/epoch-NNN/` after every epoch.
    pub save_every_epoch: bool,
    /// Stop after this many optimizer steps (a smoke run); the schedule still spans all epochs.
    pub max_steps: Option<u64>,
    /// The command line, recorded in sft.json.
    pub command: Vec<String>,
}

/// One progress report, after every optimizer step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Progress {
    /// Epoch (1-based).
    pub epoch: u64,
    /// Epochs in all.
    pub epochs: u64,
    /// Steps done over the whole run.
    pub step: u64,
    /// Steps of the whole run.
    pub total_steps: u64,
    /// The step's loss.
    pub loss: f64,
    /// Its learning rate.
    pub lr: f64,
    /// Tokens (prompt + response) per second since the start.
    pub tokens_per_s: f64,
    /// Seconds since the start.
    pub elapsed_s: f64,
    /// Estimated seconds left.
    pub eta_s: f64,
}

/// One epoch's figures.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EpochRecord {
    /// 1-based.
    pub epoch: u64,
    /// Optimizer steps in the epoch.
    pub steps: u64,
    /// Token-weighted mean of the steps' losses (each measured before its step).
    pub train_loss: f64,
    /// Validation loss after the epoch (`None` without a validation split).
    pub val_loss: Option<f64>,
    /// Prompt + response tokens trained on.
    pub tokens: usize,
    /// Tokens per second of the epoch's training (validation excluded).
    pub tokens_per_s: f64,
    /// Fraction of computed positions that were padding.
    pub padding: f64,
    /// Seconds, validation included.
    pub seconds: f64,
}

/// The corpus file as recorded.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CorpusRecord {
    /// As given.
    pub path: String,
    /// Size in bytes.
    pub bytes: u64,
    /// SHA-256 of the file, hex.
    pub sha256: String,
    /// Examples (lines).
    pub examples: usize,
    /// Training examples kept.
    pub train: usize,
    /// Validation examples kept.
    pub validation: usize,
    /// What validation held out whole: "task" or "form".
    pub split_by: String,
    /// The forms held out for validation (by form).
    pub held_out_forms: Vec<String>,
    /// The tasks held out for validation (by task).
    pub held_out_tasks: Vec<String>,
    /// Examples cut to max_len.
    pub truncated: usize,
    /// Examples dropped for length.
    pub dropped: usize,
    /// Examples dropped because their response was longer than `max_response` tokens.
    pub long_responses: usize,
}

/// `sft.json`: how the checkpoint was made.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SftRecord {
    /// The command line.
    pub command: Vec<String>,
    /// The corpus.
    pub corpus: CorpusRecord,
    /// The tokenizer file.
    pub tokenizer: String,
    /// The starting checkpoint, when not a fresh model.
    pub init: Option<String>,
    /// The model's config.json.
    pub model: Qwen2Config,
    /// Parameters.
    pub parameters: usize,
    /// The settings, after defaults.
    pub settings: serde_json::Value,
    /// Per epoch.
    pub epochs: Vec<EpochRecord>,
    /// Optimizer steps taken.
    pub steps: u64,
    /// Whether `max_steps` ended the run early.
    pub stopped_early: bool,
    /// Seconds from start to the saved checkpoint.
    pub wall_s: f64,
    /// burn's name of the device.
    pub device: String,
    /// The dtype the weights were trained in ("f32", "bf16"): the model's own, as burn reports
    /// it, not the flag's.
    pub dtype: String,
}

/// Runs `kevin sft train` on the backend `device` selects (see [`uses_cuda`]).
pub fn run_on(
    device: BurnDevice,
    args: &SftArgs,
    progress: &mut dyn FnMut(&Progress),
    epoch_done: &mut dyn FnMut(&EpochRecord),
) -> Result<SftRecord, String> {
    if uses_cuda(device) {
        crate::cuda_setup::require_gpu("--device cuda")?;
        let gpu = crate::cuda_setup::cuda_device(0);
        match args.dtype {
            SftDtype::F32 => run::<CudaTrain>(args, &gpu, progress, epoch_done),
            SftDtype::Bf16 => run::<CudaTrainBf16>(args, &gpu, progress, epoch_done),
        }
    } else if args.dtype == SftDtype::Bf16 {
        Err("--dtype bf16 trains on CUDA only (the CPU backend trains in f32): pass --dtype f32 or --device cuda".to_string())
    } else {
        run::<CpuTrain>(args, &Default::default(), progress, epoch_done)
    }
}

/// The config.json of a fresh model: `shape`, the tokenizer's vocabulary, tied embeddings, RoPE
/// base 10000, `<|endoftext|>` as BOS and `<|im_end|>` as EOS (the chat template's end of turn,
/// the sampler's stop token), positions for `max_positions` tokens.
pub fn fresh_config(
    shape: &ModelShape,
    tokenizer: &Tokenizer,
    max_positions: usize,
) -> Result<Qwen2Config, String> {
    let json = serde_json::json!({
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "vocab_size": tokenizer.vocab_size(),
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "max_position_embeddings": max_positions,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": true,
        "hidden_act": "silu",
        "use_sliding_window": false,
        "initializer_range": 0.02,
        "torch_dtype": "float32",
        "bos_token_id": tokenizer.token_id(ENDOFTEXT),
        "eos_token_id": tokenizer.token_id(IM_END),
    });
    Qwen2Config::from_json(&json.to_string()).map_err(|e| format!("model shape: {e}"))
}

/// Positions a fresh model is configured for: the policy's default `max_len` (4096) or more.
/// RoPE has no learned positions, so this only bounds the rotation table.
const MIN_POSITIONS: usize = 4096;

/// Runs `kevin sft train` on the autodiff backend `B`. `progress` is called after every
/// optimizer step, `epoch_done` after every epoch (its validation included).
pub fn run<B: AutodiffBackend>(
    args: &SftArgs,
    device: &B::Device,
    progress: &mut dyn FnMut(&Progress),
    epoch_done: &mut dyn FnMut(&EpochRecord),
) -> Result<SftRecord, String> {
    let started = Instant::now();
    if args.batch_tokens == 0 || args.max_len < 2 || args.epochs == 0 {
        return Err(format!(
            "--batch-tokens {} / --max-len {} / --epochs {}: need batch tokens >= 1, max len >= 2, epochs >= 1",
            args.batch_tokens, args.max_len, args.epochs
        ));
    }
    let bytes =
        std::fs::read(&args.corpus).map_err(|e| format!("{}: {e}", args.corpus.display()))?;
    let sha256 = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>();
    drop(bytes);
    let examples = corpus::read_jsonl(&args.corpus)?;
    if examples.is_empty() {
        return Err(format!("{}: no examples", args.corpus.display()));
    }
    let tokenizer = Tokenizer::from_file(&args.tokenizer).map_err(|e| e.to_string())?;
    let split = corpus::split::split(&examples, args.val_split, args.val_fraction, args.seed);
    let train = tokenize(
        &examples,
        &split.train,
        &tokenizer,
        args.max_len,
        args.overlong,
        args.max_response,
    )?;
    let val = tokenize(
        &examples,
        &split.validation,
        &tokenizer,
        args.max_len,
        args.overlong,
        args.max_response,
    )?;
    if train.examples.is_empty() {
        return Err(format!(
            "{}: no training example fits --max-len {} ({} dropped) and --max-response-tokens \
             {} ({} dropped)",
            args.corpus.display(),
            args.max_len,
            train.dropped,
            args.max_response
                .map_or("none".to_string(), |m| m.to_string()),
            train.long_responses
        ));
    }

    let model: Qwen2<B> = match &args.init {
        Some(dir) => {
            let (model, _) = open_model::<B>(dir, args.seed, device)
                .map_err(|e| format!("--init {}: {e}", dir.display()))?;
            let cfg = model.config();
            if cfg.vocab_size < tokenizer.vocab_size() {
                return Err(format!(
                    "--init {}: vocab_size {} is smaller than the {} tokens of {}",
                    dir.display(),
                    cfg.vocab_size,
                    tokenizer.vocab_size(),
                    args.tokenizer.display()
                ));
            }
            if cfg.max_position_embeddings < args.max_len {
                return Err(format!(
                    "--init {}: max_position_embeddings {} is below --max-len {}",
                    dir.display(),
                    cfg.max_position_embeddings,
                    args.max_len
                ));
            }
            model
        }
        None => {
            let cfg = fresh_config(&args.shape, &tokenizer, args.max_len.max(MIN_POSITIONS))?;
            B::seed(device, args.seed);
            Qwen2::new(&cfg, device).map_err(|e| format!("model shape: {e}"))?
        }
    };
    let parameters = model.num_params();
    let dtype = format!("{:?}", model.dtype()).to_lowercase();

    let lengths: Vec<usize> = train.examples.iter().map(SftExample::len).collect();
    let steps_per_epoch = epoch_batches(&lengths, args.batch_tokens, args.seed, 0).len() as u64;
    // Every epoch packs the same lengths into (nearly) the same number of batches; the count of
    // epoch 0 sets the schedule, and the cosine simply ends at its floor if an epoch runs longer.
    let total_steps = steps_per_epoch * args.epochs;
    let warmup_steps = args
        .warmup_steps
        .unwrap_or_else(|| (total_steps as f64 * 0.05).ceil() as u64);
    let config = SftConfig {
        lr: args.lr,
        min_lr: args.lr * args.min_lr_ratio,
        warmup_steps,
        total_steps,
        grad_clip: args.grad_clip,
        adamw: AdamWSettings {
            weight_decay: args.weight_decay,
            beta_1: 0.9,
            beta_2: 0.95,
            epsilon: 1e-8,
        },
        micro_batch_tokens: args.micro_batch_tokens.unwrap_or(args.batch_tokens),
    };
    let settings = serde_json::json!({
        "args": args,
        "steps_per_epoch": steps_per_epoch,
        "total_steps": total_steps,
        "warmup_steps": warmup_steps,
        "min_lr": config.min_lr,
        "adamw": {"beta_1": 0.9, "beta_2": 0.95, "epsilon": 1e-8, "weight_decay": args.weight_decay},
        "micro_batch_tokens": config.micro_batch_tokens,
    });
    let mut trainer = SftTrainer::<B, Qwen2<B>>::new(model, config).map_err(|e| e.to_string())?;

    std::fs::create_dir_all(&args.out).map_err(|e| format!("{}: {e}", args.out.display()))?;
    let val_refs: Vec<&SftExample> = val.examples.iter().collect();
    let mut epochs = Vec::new();
    let mut tokens_done = 0usize;
    let mut train_seconds = 0.0;
    let mut stopped_early = false;
    'epochs: for epoch in 1..=args.epochs {
        let epoch_start = Instant::now();
        let batches = epoch_batches(&lengths, args.batch_tokens, args.seed, epoch - 1);
        let (mut loss_sum, mut loss_tokens, mut tokens, mut padded, mut steps) = (0.0, 0, 0, 0, 0);
        for batch in &batches {
            if args.max_steps.is_some_and(|m| trainer.steps() >= m) {
                stopped_early = true;
            }
            if stopped_early {
                break;
            }
            let refs: Vec<&SftExample> = batch.iter().map(|&i| &train.examples[i]).collect();
            let s = trainer.step(&refs).map_err(|e| e.to_string())?;
            loss_sum += s.loss * s.response_tokens as f64;
            loss_tokens += s.response_tokens;
            tokens += s.tokens;
            padded += s.padded_tokens;
            steps += 1;
            tokens_done += s.tokens;
            let elapsed = train_seconds + epoch_start.elapsed().as_secs_f64();
            let done = trainer.steps();
            let planned = args.max_steps.map_or(total_steps, |m| m.min(total_steps));
            progress(&Progress {
                epoch,
                epochs: args.epochs,
                step: done,
                total_steps: planned,
                loss: s.loss,
                lr: s.lr,
                tokens_per_s: tokens_done as f64 / elapsed.max(1e-9),
                elapsed_s: started.elapsed().as_secs_f64(),
                eta_s: elapsed / done.max(1) as f64 * planned.saturating_sub(done) as f64,
            });
        }
        let train_s = epoch_start.elapsed().as_secs_f64();
        train_seconds += train_s;
        if steps == 0 {
            break 'epochs;
        }
        let val_loss = if val_refs.is_empty() {
            None
        } else {
            Some(
                trainer
                    .evaluate(&val_refs, args.batch_tokens)
                    .map_err(|e| e.to_string())?
                    .0,
            )
        };
        let record = EpochRecord {
            epoch,
            steps,
            train_loss: loss_sum / loss_tokens.max(1) as f64,
            val_loss,
            tokens,
            tokens_per_s: tokens as f64 / train_s.max(1e-9),
            padding: 1.0 - tokens as f64 / padded.max(1) as f64,
            seconds: epoch_start.elapsed().as_secs_f64(),
        };
        epoch_done(&record);
        epochs.push(record);
        if args.save_every_epoch {
            save(
                &trainer.full_precision_model(),
                &tokenizer,
                &args.out.join(format!("epoch-{epoch:03}")),
            )?;
        }
        if stopped_early {
            break;
        }
    }

    let steps = trainer.steps();
    let model = trainer.full_precision_model();
    drop(trainer);
    save(&model, &tokenizer, &args.out)?;
    let record = SftRecord {
        command: args.command.clone(),
        corpus: CorpusRecord {
            path: args.corpus.display().to_string(),
            bytes: std::fs::metadata(&args.corpus).map_or(0, |m| m.len()),
            sha256,
            examples: examples.len(),
            train: train.examples.len(),
            validation: val.examples.len(),
            split_by: split.by.name().to_string(),
            held_out_forms: if split.by == SplitBy::Form {
                split.held_out.clone()
            } else {
                Vec::new()
            },
            held_out_tasks: if split.by == SplitBy::Task {
                split.held_out
            } else {
                Vec::new()
            },
            truncated: train.truncated + val.truncated,
            dropped: train.dropped + val.dropped,
            long_responses: train.long_responses + val.long_responses,
        },
        tokenizer: args.tokenizer.display().to_string(),
        init: args.init.as_ref().map(|p| p.display().to_string()),
        model: model.config().clone(),
        parameters,
        settings,
        epochs,
        steps,
        stopped_early,
        wall_s: started.elapsed().as_secs_f64(),
        device: B::name(device),
        dtype,
    };
    let path = args.out.join(RECORD_FILE);
    let text = serde_json::to_string_pretty(&record).map_err(|e| e.to_string())?;
    std::fs::write(&path, text + "\n").map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(record)
}

/// Writes the Hugging Face directory: config.json, model.safetensors (f32), tokenizer.json.
fn save<B: Backend>(model: &Qwen2<B>, tokenizer: &Tokenizer, dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    checkpoint::save(model, model.config(), dir, SaveDtype::F32).map_err(|e| e.to_string())?;
    let path = dir.join(TOKENIZER_FILE);
    tokenizer
        .save(&path)
        .map_err(|e| format!("{}: {e}", path.display()))
}
