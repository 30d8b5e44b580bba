//! Supervised warm start (`kevin sft train`): next-token training of the policy on the corpus's
//! responses, before RL.
//!
//! The loss is the mean negative log-likelihood of the response tokens of a batch: prompt tokens
//! are context only (the [`crate::loss::TokenBatch`] selects response positions, so there is no
//! mask to get wrong), and every micro-batch's sum is divided by the token count of the *whole*
//! batch, so summing micro-batch gradients gives exactly the batch's gradient however the batch
//! is split. Log-probs come from [`crate::loss::token_logprobs`], the learner's own (f32
//! log-softmax, only response rows); the optimizer step, clipping and gradient summation are the
//! RL trainer's ([`crate::optim::OptimizedModel`], [`crate::train::summed_gradients`]).
//!
//! Schedule: linear warm-up to `lr`, then cosine decay to `min_lr` at the last step.
//!
//! - `data.rs`: tokenising the corpus, over-long examples, the batches of an epoch.
//! - `run.rs`: the command: model, epochs, validation, progress, the output directory.
//!
//! Dependencies: the warm start builds on the RL side's pieces (`train`'s micro-batches and
//! gradient sums, `optim`, `loss`, `qwen2`, `burn_learner::open_model`, the tokenizer); none of
//! those may import `sft`. Outside the crate, the `kevin sft` command calls [`run`] and the
//! re-exported data items; the trainer internals are not for other callers.

pub mod data;
pub mod fixture;
pub mod run;

use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::Tensor;

use crate::gate::StepGate;
use crate::loss::{token_logprobs, BatchError, TokenBatch};
use crate::optim::{reject_if, AdamWSettings, InvalidSetting, OptimizedModel};
use crate::train::{
    check_micro_batch_tokens, scalar_f64, summed_gradients, token_micro_batches, SummedGradients,
};
use crate::CausalLm;
pub use data::{epoch_batches, tokenize, Overlong, SftExample, Tokenized};

/// The optimisation settings of the warm start.
#[derive(Debug, Clone, PartialEq)]
pub struct SftConfig {
    /// Peak learning rate, reached at the end of warm-up.
    pub lr: f64,
    /// Learning rate at the last step.
    pub min_lr: f64,
    /// Optimizer steps of linear warm-up.
    pub warmup_steps: u64,
    /// Optimizer steps of the whole run (the end of the cosine).
    pub total_steps: u64,
    /// Global gradient-norm clip.
    pub grad_clip: f64,
    /// AdamW's hyper-parameters.
    pub adamw: AdamWSettings,
    /// Largest micro-batch in padded positions (memory, not maths: the gradient is the same).
    pub micro_batch_tokens: usize,
}

impl SftConfig {
    /// Checks the settings; the error names the flag.
    pub fn validate(&self) -> Result<(), SftError> {
        reject_if(
            !(self.lr.is_finite() && self.lr > 0.0),
            "lr",
            self.lr,
            "must be finite and > 0",
        )?;
        reject_if(
            !(self.min_lr >= 0.0 && self.min_lr <= self.lr),
            "min_lr",
            self.min_lr,
            "must be in [0, lr]",
        )?;
        reject_if(
            self.grad_clip.is_nan() || self.grad_clip <= 0.0,
            "grad_clip",
            self.grad_clip,
            "must be > 0",
        )?;
        reject_if(
            !(self.adamw.weight_decay >= 0.0 && self.adamw.weight_decay.is_finite()),
            "weight_decay",
            self.adamw.weight_decay,
            "must be >= 0",
        )?;
        check_micro_batch_tokens(self.micro_batch_tokens)?;
        Ok(())
    }
}

/// A failure of the warm start's trainer.
#[derive(Debug, thiserror::Error)]
pub enum SftError {
    /// A setting it cannot work with.
    #[error("sft setting {0}")]
    Config(InvalidSetting),
    /// A batch could not be formed.
    #[error("sft batch: {0}")]
    Batch(#[from] BatchError),
    /// The gradient was NaN or infinite; the step was not taken.
    #[error("sft optimizer step {step}: gradient norm is {norm}; the step was not taken")]
    NonFiniteGradient {
        /// The step (0-based).
        step: u64,
        /// The norm.
        norm: f64,
    },
}

impl From<InvalidSetting> for SftError {
    fn from(e: InvalidSetting) -> Self {
        SftError::Config(e)
    }
}

/// The learning rate of optimizer step `step` (0-based): linear warm-up over `warmup` steps
/// (lr/warmup, ..., lr), then a cosine from `lr` down to `min_lr` at step `total - 1`.
pub fn warmup_cosine_lr(lr: f64, min_lr: f64, warmup: u64, total: u64, step: u64) -> f64 {
    if step < warmup {
        return lr * (step + 1) as f64 / warmup as f64;
    }
    let decay_steps = total.saturating_sub(warmup).saturating_sub(1);
    if decay_steps == 0 {
        return lr;
    }
    let progress = ((step - warmup) as f64 / decay_steps as f64).min(1.0);
    min_lr + 0.5 * (lr - min_lr) * (1.0 + (std::f64::consts::PI * progress).cos())
}

/// The loss of one micro-batch: minus the sum of its response tokens' log-probs, divided by
/// `normaliser` (the response-token count of the whole batch the micro-batch belongs to).
pub fn nll_loss<B, M>(model: &M, batch: &TokenBatch, normaliser: usize) -> Tensor<B, 1>
where
    B: burn::tensor::backend::Backend,
    M: CausalLm<B> + ?Sized,
{
    token_logprobs(model, batch)
        .sum()
        .neg()
        .div_scalar(normaliser.max(1) as f64)
}

/// The micro-batches of `batch` (at most `max_tokens` padded positions each) as token batches.
fn token_batches(
    batch: &[&SftExample],
    max_tokens: usize,
    multiple: usize,
) -> Result<Vec<TokenBatch>, SftError> {
    let rows: Vec<_> = batch
        .iter()
        .map(|e| (e.prompt.as_slice(), e.response.as_slice()))
        .collect();
    token_micro_batches(&rows, max_tokens, multiple)
        .map(|(_, tokens)| tokens.map_err(SftError::from))
        .collect()
}

/// What one optimizer step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepStats {
    /// Mean NLL per response token of the batch, before the step.
    pub loss: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// The learning rate of the step.
    pub lr: f64,
    /// Response tokens (the loss's denominator).
    pub response_tokens: usize,
    /// Prompt + response tokens.
    pub tokens: usize,
    /// Positions computed, padding included.
    pub padded_tokens: usize,
}

/// The warm start's trainer: a [`CausalLm`] with AdamW, stepped one batch at a time.
pub struct SftTrainer<B, M>
where
    B: AutodiffBackend,
    M: CausalLm<B> + AutodiffModule<B>,
    M::InnerModule: CausalLm<B::InnerBackend>,
{
    /// The model, its AdamW state and the steps taken.
    optimized: OptimizedModel<B, M>,
    config: SftConfig,
}

impl<B, M> SftTrainer<B, M>
where
    B: AutodiffBackend,
    M: CausalLm<B> + AutodiffModule<B>,
    M::InnerModule: CausalLm<B::InnerBackend>,
{
    /// A trainer with fresh optimizer state.
    pub fn new(model: M, config: SftConfig) -> Result<Self, SftError> {
        config.validate()?;
        Ok(SftTrainer {
            optimized: OptimizedModel::new(model, config.adamw),
            config,
        })
    }

    /// The model being trained.
    pub fn model(&self) -> &M {
        self.optimized.model()
    }

    /// The trained model.
    pub fn into_model(self) -> M {
        self.optimized.into_model()
    }

    /// Optimizer steps taken.
    pub fn steps(&self) -> u64 {
        self.optimized.steps()
    }

    /// The model in full precision: the optimizer's f32 master weights where the model's own are
    /// rounded from them (a bf16 model), what a checkpoint holds.
    pub fn full_precision_model(&self) -> M {
        self.optimized.full_precision()
    }

    /// The settings.
    pub fn config(&self) -> &SftConfig {
        &self.config
    }

    /// The gradient of the batch's mean response-token NLL, summed over its micro-batches, with
    /// the loss value; `None` when the batch has no response token.
    pub fn batch_gradients(
        &self,
        batch: &[&SftExample],
    ) -> Result<Option<SummedGradients>, SftError> {
        let n: usize = batch.iter().map(|e| e.response.len()).sum();
        if n == 0 {
            return Ok(None);
        }
        let model = self.model();
        let multiple = crate::train::seq_bucket::<B>(&model.device());
        let micro = token_batches(batch, self.config.micro_batch_tokens, multiple)?;
        for mb in &micro {
            mb.check_vocab(model.vocab_size())?;
        }
        // The warm start runs alone (`kevin sft`): no timing lease to honour.
        let device = model.device();
        Ok(Some(summed_gradients(
            model,
            &micro,
            &StepGate::open(),
            &device,
            |mb| nll_loss(model, mb, n),
        )))
    }

    /// One AdamW step on `batch` at the schedule's learning rate. A batch without a response
    /// token takes no step and reports loss 0.
    pub fn step(&mut self, batch: &[&SftExample]) -> Result<StepStats, SftError> {
        let c = &self.config;
        let step = self.optimized.steps();
        let lr = warmup_cosine_lr(c.lr, c.min_lr, c.warmup_steps, c.total_steps, step);
        let longest = batch.iter().map(|e| e.len()).max().unwrap_or(0);
        let mut stats = StepStats {
            loss: 0.0,
            grad_norm: 0.0,
            lr,
            response_tokens: batch.iter().map(|e| e.response.len()).sum(),
            tokens: batch.iter().map(|e| e.len()).sum(),
            padded_tokens: longest * batch.len(),
        };
        let Some(g) = self.batch_gradients(batch)? else {
            return Ok(stats);
        };
        let max_norm = self.config.grad_clip;
        stats.grad_norm = self
            .optimized
            .step(g.grads, max_norm, lr)
            .map_err(|norm| SftError::NonFiniteGradient { step, norm })?;
        stats.loss = g.loss;
        Ok(stats)
    }

    /// Mean NLL per response token of `examples` under the current weights, without a graph
    /// (on the inner backend), in micro-batches of at most `batch_tokens` padded positions; with
    /// the response-token count. (0, 0) when there is no response token.
    pub fn evaluate(
        &self,
        examples: &[&SftExample],
        batch_tokens: usize,
    ) -> Result<(f64, usize), SftError> {
        let n: usize = examples.iter().map(|e| e.response.len()).sum();
        if n == 0 {
            return Ok((0.0, 0));
        }
        let model = self.model().valid();
        let mut total: Option<Tensor<B::InnerBackend, 1>> = None;
        let multiple = crate::train::seq_bucket::<B>(&model.device());
        for mb in token_batches(examples, batch_tokens, multiple)? {
            mb.check_vocab(model.vocab_size())?;
            let loss = nll_loss(&model, &mb, n);
            total = Some(match total {
                Some(t) => t + loss,
                None => loss,
            });
        }
        Ok((total.map_or(0.0, |t| scalar_f64(t.into_data())), n))
    }
}

#[cfg(test)]
mod tests;
