//! The burn learner: kevin's [`Learner`] over the [`Trainer`] of a [`Qwen2`] and the tokenizer.
//!
//! - `train`: each turn's prompt is tokenised exactly as [`crate::burn_policy::BurnPolicy`]
//!   tokenised it ([`prompt_tokens`]); the response tokens are the turn record's
//!   `response_tokens`, never re-tokenised, so they line up with the behaviour log-probs.
//! - `weights`: the model on the inference backend (`model.valid()`, a `Qwen2<B::InnerBackend>`),
//!   shared rather than copied: burn tensors are reference-counted on one device.
//! - `save`/`load`: a Hugging Face checkpoint directory (config.json + model.safetensors in f32,
//!   so it opens in transformers), tokenizer.json, and the optimizer state with the learner version
//!   and optimizer-step counter (`learner_optimizer.safetensors`, see [`Trainer::save_optimizer`]).
//!
//! A turn whose response is empty (a request the policy rejected, see
//! [`crate::burn_policy`]) has no token to train on; its prompt is cut to its last token so that a
//! prompt longer than the model's positions cannot fail the batch, and the sample still counts in
//! the Dr. GRPO divisor like every other turn of the batch.

use std::path::Path;
use std::sync::Arc;

use burn::module::AutodiffModule;
use burn::tensor::backend::{AutodiffBackend, Backend};
use kevin::config::{LearnerSection, SamplingSection};
use kevin::learner::{Learner, LearnerError, TrainStats};
use kevin::policy::Weights;
use kevin::replay::Batch;

use crate::burn_policy::prompt_tokens;
use crate::checkpoint::{self, CheckpointError, SaveDtype};
use crate::qwen2::{ConfigError, Qwen2, Qwen2Config};
use crate::tokenizer::Tokenizer;
use crate::train::{train_samples, TrainError, Trainer, TrainerConfig, DEFAULT_MICRO_BATCH_TOKENS};

/// The tokenizer's file name in a checkpoint directory.
pub const TOKENIZER_FILE: &str = "tokenizer.json";

/// Why a model could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The checkpoint could not be read.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// config.json describes a model that cannot be built.
    #[error("{path}: {source}")]
    Config {
        /// The config file.
        path: String,
        /// The bad key.
        source: ConfigError,
    },
}

/// Loads the Hugging Face directory `dir` onto `device`; when it has no weights file
/// (`model.safetensors` or a shard index), builds the model of its config.json with random
/// weights seeded by `seed` instead. The flag says whether the weights are random.
pub fn open_model<B: Backend>(
    dir: &Path,
    seed: u64,
    device: &B::Device,
) -> Result<(Qwen2<B>, bool), OpenError> {
    let has_weights =
        dir.join("model.safetensors").exists() || dir.join("model.safetensors.index.json").exists();
    if has_weights {
        return Ok((checkpoint::load::<B>(dir, device)?.0, false));
    }
    let cfg = checkpoint::load_config(dir)?;
    B::seed(device, seed);
    let model = Qwen2::new(&cfg, device).map_err(|source| OpenError::Config {
        path: dir.join("config.json").display().to_string(),
        source,
    })?;
    Ok((model, true))
}

/// kevin's learner in burn. See the module docs.
pub struct BurnLearner<B: AutodiffBackend> {
    trainer: Trainer<B, Qwen2<B>>,
    tokenizer: Arc<Tokenizer>,
    config: TrainerConfig,
    /// The frozen model of the KL term (kept across `load`, which rebuilds the trainer).
    reference: Option<Qwen2<B::InnerBackend>>,
    device: B::Device,
}

impl<B: AutodiffBackend> BurnLearner<B> {
    /// A learner at version 0 training `model` (f32 weights) with the settings of `[learner]`
    /// and `[sampling]`. With `learner.kl_coef > 0` the starting model is the KL reference.
    pub fn new(
        model: Qwen2<B>,
        tokenizer: Arc<Tokenizer>,
        learner: &LearnerSection,
        sampling: &SamplingSection,
    ) -> Result<Self, TrainError> {
        let mut config = TrainerConfig::new(learner, sampling);
        config.micro_batch_tokens = micro_batch_tokens::<B>(model.config());
        let reference = (config.kl_coef > 0.0).then(|| model.valid());
        let device = crate::CausalLm::device(&model);
        let trainer = Trainer::new(model, config.clone(), reference.clone())?;
        Ok(BurnLearner {
            trainer,
            tokenizer,
            config,
            reference,
            device,
        })
    }

    /// Makes the learner's steps honour `gate`'s GPU timing lease ([`Trainer::set_gate`]).
    pub fn set_gate(&mut self, gate: crate::gate::StepGate) {
        self.trainer.set_gate(gate);
    }

    /// The trainer (model, settings, counters).
    pub fn trainer(&self) -> &Trainer<B, Qwen2<B>> {
        &self.trainer
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// The model on the inference backend: what [`Learner::weights`] publishes.
    pub fn inference_model(&self) -> Qwen2<B::InnerBackend> {
        self.trainer.model().valid()
    }

    fn checkpoint_error(&self, dir: &Path, reason: impl std::fmt::Display) -> LearnerError {
        LearnerError::Checkpoint {
            learner: "burn".into(),
            path: dir.display().to_string(),
            reason: reason.to_string(),
        }
    }
}

impl<B: AutodiffBackend> Learner for BurnLearner<B> {
    fn describe(&self) -> String {
        let cfg = self.trainer.model().config();
        format!(
            "burn learner: Qwen2 {} layers, hidden {}, vocab {}; lr {}, {:?} correction, {} \
             optimizer steps per batch, micro-batches of up to {} positions; backend {}",
            cfg.num_hidden_layers,
            cfg.hidden_size,
            cfg.vocab_size,
            self.config.lr,
            self.config.correction,
            self.config.optimizer_steps,
            self.config.micro_batch_tokens,
            B::name(&self.device)
        )
    }

    fn version(&self) -> u64 {
        self.trainer.version()
    }

    fn train(&mut self, batch: &Batch) -> Result<TrainStats, LearnerError> {
        let fail = |version: u64, reason: String| LearnerError::Train {
            learner: "burn".into(),
            version,
            reason,
        };
        let version = self.trainer.version();
        let tokenizer = self.tokenizer.clone();
        let mut samples = train_samples(batch, |prompt| {
            prompt_tokens(&tokenizer, prompt).map_err(|e| e.to_string())
        })
        .map_err(|e| fail(version, e.to_string()))?;
        for s in &mut samples {
            if s.response_tokens.is_empty() && s.prompt_tokens.len() > 1 {
                s.prompt_tokens.drain(..s.prompt_tokens.len() - 1);
            }
        }
        self.trainer
            .train_batch(&samples)
            .map_err(|e| fail(version, e.to_string()))
    }

    fn weights(&self) -> Weights {
        Weights {
            version: self.trainer.version(),
            payload: Arc::new(self.inference_model()),
        }
    }

    fn save(&self, dir: &Path) -> Result<(), LearnerError> {
        let model = self.trainer.model();
        checkpoint::save(model, model.config(), dir, SaveDtype::F32)
            .map_err(|e| self.checkpoint_error(dir, e))?;
        self.tokenizer
            .save(dir.join(TOKENIZER_FILE))
            .map_err(|e| self.checkpoint_error(dir, e))?;
        self.trainer
            .save_optimizer(dir)
            .map_err(|e| self.checkpoint_error(dir, e))
    }

    fn load(&mut self, dir: &Path) -> Result<(), LearnerError> {
        let saved = Tokenizer::from_file(dir.join(TOKENIZER_FILE))
            .map_err(|e| self.checkpoint_error(dir, e))?;
        if saved.vocab_size() != self.tokenizer.vocab_size() {
            return Err(self.checkpoint_error(
                dir,
                format!(
                    "{TOKENIZER_FILE} has {} tokens, the configured tokenizer {}",
                    saved.vocab_size(),
                    self.tokenizer.vocab_size()
                ),
            ));
        }
        let (model, _) =
            checkpoint::load::<B>(dir, &self.device).map_err(|e| self.checkpoint_error(dir, e))?;
        let mut trainer = Trainer::new(model, self.config.clone(), self.reference.clone())
            .map_err(|e| self.checkpoint_error(dir, e))?;
        trainer
            .load_optimizer(dir)
            .map_err(|e| self.checkpoint_error(dir, e))?;
        // The rebuilt trainer keeps honouring the timing lease.
        trainer.set_gate(self.trainer.take_gate());
        self.trainer = trainer;
        Ok(())
    }
}

/// Padded positions per learner micro-batch for a model of `cfg` on backend `B`.
///
/// [`DEFAULT_MICRO_BATCH_TOKENS`] is sized for Qwen2's 151,936-token logits (about 2.4 MB a
/// position in the loss). Where the attention keeps no score matrix ([`crate::flash`] serves
/// `B` and the model's heads), a position's memory does not grow with the sequence, so a model
/// with a smaller vocabulary gets as many positions as fit the same memory: its logits (four
/// f32 copies in the loss) and each layer's kept activations (about 12 hidden-wide and 6
/// MLP-wide f32 rows). The 4M policy's micro-batches grow from 8,192 to about 110,000
/// positions, so a learner step of the RL loop runs in two or three micro-batches instead of
/// twenty. Elsewhere (burn's attention, whose scores grow with `t^2`) the default stays.
pub fn micro_batch_tokens<B: Backend>(cfg: &Qwen2Config) -> usize {
    let (h, kv, d) = (
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim(),
    );
    let flash = crate::flash::SWITCH.get()
        && crate::cublas::is_cuda::<B>()
        && crate::flash::unsupported([1, h, 1, d], [1, kv, 1, d]).is_none();
    if !flash {
        return DEFAULT_MICRO_BATCH_TOKENS;
    }
    const QWEN2_VOCAB: usize = 151_936;
    let budget = DEFAULT_MICRO_BATCH_TOKENS * QWEN2_VOCAB * 16;
    let per_position = 16 * cfg.vocab_size
        + cfg.num_hidden_layers * 4 * (12 * cfg.hidden_size + 6 * cfg.intermediate_size);
    (budget / per_position.max(1)).max(DEFAULT_MICRO_BATCH_TOKENS)
}

/// The config of a model: what `kevin policy init` writes, with the vocabulary set to the
/// tokenizer's size. Returns the config and, when it changed, the vocabulary size it had.
pub fn config_for_tokenizer(
    mut cfg: Qwen2Config,
    tokenizer: &Tokenizer,
) -> (Qwen2Config, Option<usize>) {
    let vocab = tokenizer.vocab_size();
    if cfg.vocab_size == vocab {
        return (cfg, None);
    }
    let old = cfg.vocab_size;
    cfg.vocab_size = vocab;
    (cfg, Some(old))
}

#[cfg(test)]
#[path = "burn_tests.rs"]
mod tests;
