//! The learner's optimisation loop: micro-batched gradients of the policy-gradient loss, global
//! gradient-norm clipping, AdamW with linear warm-up, and the optimizer state in checkpoints.
//!
//! [`Trainer::train_batch`] takes one batch of [`TrainSample`]s (tokenised turns with their
//! behaviour log-probs and advantages) and takes `optimizer_steps` AdamW steps on it. Each step
//! runs the batch in micro-batches of at most `micro_batch_tokens` padded positions, sums their
//! gradients (the Dr. GRPO divisor is a constant of the whole batch, so the sum is exactly the
//! gradient of the whole batch), clips the global norm and steps. With the decoupled correction the
//! proximal log-probs are computed once per batch, before the first step, from the weights the
//! batch started with; with `kl_coef > 0` the reference log-probs are computed once per batch from
//! the frozen reference model. Both run on the inner (non-autodiff) backend: no graph is built.
//!
//! # Precision
//!
//! Weights, gradients and the AdamW moments stay in the model's parameter dtype, which for
//! training must be f32: at the recipe's lr of 1e-6 an update is ~1e-6 of a weight, far below
//! bf16's resolution (2^-8), so bf16 master weights would not move at all. The forward pass runs
//! in whatever the model computes in (the backend's float type); the log-softmax, the losses and
//! the norm are always f32 ([`crate::loss`]). A bf16 forward over f32 master weights is the model's
//! business (casting inside `forward`), not the learner's. The optimizer state is saved with
//! `FullPrecisionSettings` so a resumed run continues bit for bit.
//!
//! The optimizer itself (AdamW, the warm-up, the clipped step and its state on disk) is
//! [`crate::optim`]'s, shared with the warm start.

use std::path::Path;

use burn::module::AutodiffModule;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor};
use kevin::config::{Correction, LearnerSection, SamplingSection};
use kevin::learner::TrainStats;
use kevin::replay::Batch;
use kevin::rl::Clip;

use crate::gate::StepGate;
use crate::loss::{
    clipped_surrogate, decoupled_surrogate, drgrpo_loss, f32_tensor, kl_k3, token_logprobs,
    BatchError, TokenBatch,
};
use crate::optim::{reject_if, warmup_lr, AdamWSettings, InvalidSetting, OptimizedModel};
use crate::CausalLm;

/// Padded positions per micro-batch when nothing else is said: 8192 positions of 151936 f32
/// logits are 5 GB per `[tokens, vocab]` copy, and the loss keeps about four of them alive.
pub const DEFAULT_MICRO_BATCH_TOKENS: usize = 8192;

/// One turn-sample to train on. Tokenising the prompt is the caller's job; it must be tokenised
/// exactly as the generator tokenised it, or the log-probs do not match the behaviour ones.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainSample {
    /// Token ids of the turn's full prompt (at least one).
    pub prompt_tokens: Vec<u32>,
    /// Token ids of the response.
    pub response_tokens: Vec<u32>,
    /// Log-prob of each response token under the policy that sampled it.
    pub behaviour_logprobs: Vec<f32>,
    /// The turn's advantage, shared by all its tokens.
    pub advantage: f64,
}

/// The learner's settings, from `[learner]` and `[sampling]` plus what the config file does not
/// (yet) say.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainerConfig {
    /// Off-policy correction.
    pub correction: Correction,
    /// Clip range (clip-higher).
    pub clip: Clip,
    /// Cap of pi_prox / pi_behaviour in the decoupled objective.
    pub decoupled_weight_cap: f64,
    /// Coefficient of the k3 KL to the reference model (0: off, no reference forward).
    pub kl_coef: f64,
    /// Learning rate after warm-up.
    pub lr: f64,
    /// Optimizer steps of linear warm-up.
    pub warmup_steps: u64,
    /// Optimizer steps per batch.
    pub optimizer_steps: u32,
    /// Global gradient-norm clip.
    pub grad_clip: f64,
    /// Dr. GRPO's max_tokens: the generator's max new tokens.
    pub max_tokens: usize,
    /// Largest micro-batch in padded positions (rows * longest row). A single sequence longer
    /// than this still runs, alone.
    pub micro_batch_tokens: usize,
    /// AdamW's decoupled weight decay (PyTorch's AdamW default, 0.01).
    pub weight_decay: f64,
    /// AdamW's beta_1.
    pub beta_1: f64,
    /// AdamW's beta_2.
    pub beta_2: f64,
    /// AdamW's epsilon (PyTorch's default, 1e-8).
    pub epsilon: f64,
}

impl TrainerConfig {
    /// The settings of a kevin config's `[learner]` and `[sampling]` sections.
    pub fn new(learner: &LearnerSection, sampling: &SamplingSection) -> Self {
        TrainerConfig {
            correction: learner.correction,
            clip: Clip {
                eps_low: learner.clip_low,
                eps_high: learner.clip_high,
            },
            decoupled_weight_cap: learner.decoupled_weight_cap,
            kl_coef: learner.kl_coef,
            lr: learner.lr,
            warmup_steps: learner.warmup_steps,
            optimizer_steps: learner.optimizer_steps,
            grad_clip: learner.grad_clip,
            max_tokens: sampling.max_new_tokens as usize,
            micro_batch_tokens: DEFAULT_MICRO_BATCH_TOKENS,
            weight_decay: 0.01,
            beta_1: 0.9,
            beta_2: 0.999,
            epsilon: 1e-8,
        }
    }

    /// The AdamW hyper-parameters of these settings.
    pub fn adamw(&self) -> AdamWSettings {
        AdamWSettings {
            weight_decay: self.weight_decay,
            beta_1: self.beta_1,
            beta_2: self.beta_2,
            epsilon: self.epsilon,
        }
    }

    /// Checks what the trainer relies on (the core's config validation checks the file's keys;
    /// this also covers settings made in code).
    pub fn validate(&self) -> Result<(), TrainError> {
        reject_if(
            !(self.lr.is_finite() && self.lr > 0.0),
            "learner.lr",
            self.lr,
            "must be finite and > 0",
        )?;
        reject_if(
            self.grad_clip.is_nan() || self.grad_clip <= 0.0,
            "learner.grad_clip",
            self.grad_clip,
            "must be > 0",
        )?;
        reject_if(
            !(self.kl_coef.is_finite() && self.kl_coef >= 0.0),
            "learner.kl_coef",
            self.kl_coef,
            "must be finite and >= 0",
        )?;
        reject_if(
            !(self.clip.eps_low >= 0.0 && self.clip.eps_low < 1.0),
            "learner.clip_low",
            self.clip.eps_low,
            "must be in [0, 1)",
        )?;
        reject_if(
            !(self.clip.eps_high.is_finite() && self.clip.eps_high >= 0.0),
            "learner.clip_high",
            self.clip.eps_high,
            "must be >= 0",
        )?;
        reject_if(
            self.decoupled_weight_cap.is_nan() || self.decoupled_weight_cap <= 0.0,
            "learner.decoupled_weight_cap",
            self.decoupled_weight_cap,
            "must be > 0",
        )?;
        reject_if(
            self.optimizer_steps == 0,
            "learner.optimizer_steps",
            0.0,
            "must be >= 1",
        )?;
        reject_if(
            self.max_tokens == 0,
            "sampling.max_new_tokens",
            0.0,
            "must be >= 1",
        )?;
        check_micro_batch_tokens(self.micro_batch_tokens)?;
        Ok(())
    }
}

/// A failure of the trainer.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A setting the trainer cannot work with.
    #[error("learner setting {0}")]
    Config(InvalidSetting),
    /// The KL term needs a reference model and none was given.
    #[error("learner.kl_coef = {kl_coef} needs a reference model, and none was given")]
    NoReference {
        /// The coefficient.
        kl_coef: f64,
    },
    /// A sample the trainer cannot use.
    #[error("train sample {index}: {reason}")]
    Sample {
        /// Its index in the batch.
        index: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// A micro-batch could not be formed.
    #[error("micro-batch of train samples {samples:?}: {source}")]
    Batch {
        /// Indices of its samples.
        samples: Vec<usize>,
        /// What went wrong.
        #[source]
        source: BatchError,
    },
    /// The gradient was NaN or infinite. The step was not taken, but earlier steps of the same
    /// batch were, and the version was not advanced.
    #[error("learner version {version}, optimizer step {step}: gradient norm is {norm}; the step was not taken")]
    NonFiniteGradient {
        /// The learner version.
        version: u64,
        /// The optimizer step (counted over the whole run).
        step: u64,
        /// The norm.
        norm: f64,
    },
    /// The optimizer state could not be saved or loaded.
    #[error("learner optimizer state {path}: {reason}")]
    Checkpoint {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
}

impl From<InvalidSetting> for TrainError {
    fn from(e: InvalidSetting) -> Self {
        TrainError::Config(e)
    }
}

/// Sequence lengths of learner batches are rounded up to a multiple of this on backends that
/// compile kernels per shape (see [`TokenBatch::padded_to_multiple`]); 1 elsewhere.
pub fn seq_bucket<B: Backend>(device: &B::Device) -> usize {
    if crate::qwen2::compiles_per_shape::<B>(device) {
        64
    } else {
        1
    }
}

/// Groups sequences into micro-batches of at most `max_tokens` padded positions each.
///
/// `lengths` are (sample index, prompt + response length). Longest first, so that rows of a
/// micro-batch have similar lengths and padding stays small; a sequence longer than `max_tokens`
/// gets a micro-batch of its own.
pub fn plan_micro_batches(lengths: &[(usize, usize)], max_tokens: usize) -> Vec<Vec<usize>> {
    let mut order = lengths.to_vec();
    order.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut plan: Vec<Vec<usize>> = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut longest = 0;
    for (index, len) in order {
        if !current.is_empty() && (current.len() + 1) * longest > max_tokens {
            plan.push(std::mem::take(&mut current));
        }
        if current.is_empty() {
            longest = len;
        }
        current.push(index);
    }
    if !current.is_empty() {
        plan.push(current);
    }
    plan
}

/// Both trainers' rule for their `micro_batch_tokens` setting: at least 1.
pub(crate) fn check_micro_batch_tokens(n: usize) -> Result<(), InvalidSetting> {
    reject_if(n == 0, "micro_batch_tokens", 0.0, "must be >= 1")
}

/// The micro-batches of the `rows` (prompt, response) that have a response token: planned by
/// [`plan_micro_batches`] (at most `max_tokens` padded positions each), each formed as a
/// [`TokenBatch`] padded to a multiple of `multiple`, with the indices of its rows in batch order.
/// Both trainers (RL and [`crate::sft`]) form their micro-batches here.
pub(crate) fn token_micro_batches<'a>(
    rows: &'a [(&'a [u32], &'a [u32])],
    max_tokens: usize,
    multiple: usize,
) -> impl Iterator<Item = (Vec<usize>, Result<TokenBatch, BatchError>)> + 'a {
    let lengths: Vec<(usize, usize)> = rows
        .iter()
        .enumerate()
        .filter(|(_, (_, response))| !response.is_empty())
        .map(|(i, (prompt, response))| (i, prompt.len() + response.len()))
        .collect();
    plan_micro_batches(&lengths, max_tokens)
        .into_iter()
        .map(move |indices| {
            let batch = TokenBatch::from_sequences(indices.iter().map(|&i| rows[i]))
                .map(|b| b.padded_to_multiple(multiple));
            (indices, batch)
        })
}

/// Gradients summed over micro-batches, and the sum of their losses.
pub struct SummedGradients {
    /// The summed gradients (empty when there was no micro-batch).
    pub grads: GradientsParams,
    /// The sum of the micro-batch losses (0 when there was none).
    pub loss: f64,
}

/// Sums the gradients of `loss_of(item)` over `items`, one micro-batch at a time: each graph is
/// built, differentiated and dropped before the next, so memory holds one micro-batch's
/// activations. The loss values are summed on the device and read back once. Summing is exact
/// when every micro-batch's loss is divided by a constant of the whole batch (Dr. GRPO's
/// normaliser, or the SFT batch's token count).
///
/// Each micro-batch holds `gate`'s GPU timing lease from its forward pass until its backward's
/// work on `device` is done, and releases it before the next ([`crate::gate`]).
pub fn summed_gradients<B, M, T>(
    model: &M,
    items: &[T],
    gate: &StepGate,
    device: &B::Device,
    mut loss_of: impl FnMut(&T) -> Tensor<B, 1>,
) -> SummedGradients
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
{
    let mut accumulator = GradientsAccumulator::<M>::new();
    let mut loss: Option<Tensor<B::InnerBackend, 1>> = None;
    for item in items {
        let _step = gate.enter::<B>(device);
        let mb_loss = loss_of(item);
        let value = mb_loss.clone().inner();
        loss = Some(match loss {
            Some(l) => l + value,
            None => value,
        });
        let grads = GradientsParams::from_grads(mb_loss.backward(), model);
        accumulator.accumulate(model, grads);
    }
    SummedGradients {
        grads: accumulator.grads(),
        loss: loss.map_or(0.0, |l| scalar_f64(l.into_data())),
    }
}

/// The first value of a tensor's data as f64 (0 when empty).
pub(crate) fn scalar_f64(data: burn::tensor::TensorData) -> f64 {
    data.iter::<f64>().next().unwrap_or(0.0)
}

/// One micro-batch with its per-token constants, on the inner backend (they carry no gradient).
struct MicroBatch<B: AutodiffBackend> {
    tokens: TokenBatch,
    behaviour: Tensor<B::InnerBackend, 1>,
    advantages: Tensor<B::InnerBackend, 1>,
    prox: Option<Tensor<B::InnerBackend, 1>>,
    reference: Option<Tensor<B::InnerBackend, 1>>,
}

/// The summed gradients of a batch and what the loss measured.
struct BatchGradients {
    grads: GradientsParams,
    loss: f64,
    clipped: u64,
}

/// Trains a [`CausalLm`] with kevin's policy-gradient loss. See the module docs.
pub struct Trainer<B, M>
where
    B: AutodiffBackend,
    M: CausalLm<B> + AutodiffModule<B>,
    M::InnerModule: CausalLm<B::InnerBackend>,
{
    /// The model, its AdamW state and the optimizer steps taken (which drive the warm-up).
    optimized: OptimizedModel<B, M>,
    reference: Option<M::InnerModule>,
    config: TrainerConfig,
    version: u64,
    /// Holds the GPU timing lease around each step of GPU work.
    gate: StepGate,
}

impl<B, M> Trainer<B, M>
where
    B: AutodiffBackend,
    M: CausalLm<B> + AutodiffModule<B>,
    M::InnerModule: CausalLm<B::InnerBackend>,
{
    /// A trainer at version 0 with fresh optimizer state. `reference` is the frozen model of the
    /// KL term: required when `config.kl_coef > 0`, dropped otherwise.
    pub fn new(
        model: M,
        config: TrainerConfig,
        reference: Option<M::InnerModule>,
    ) -> Result<Self, TrainError> {
        config.validate()?;
        let reference = if config.kl_coef > 0.0 {
            Some(reference.ok_or(TrainError::NoReference {
                kl_coef: config.kl_coef,
            })?)
        } else {
            None
        };
        Ok(Trainer {
            optimized: OptimizedModel::new(model, config.adamw()),
            reference,
            config,
            version: 0,
            gate: StepGate::open(),
        })
    }

    /// Makes each step of GPU work (a micro-batch's log-probs, forward and backward; an
    /// optimizer step) hold `gate`'s GPU timing lease until its work on the device is done, and
    /// release it between steps ([`crate::gate`]).
    pub fn set_gate(&mut self, gate: StepGate) {
        self.gate = gate;
    }

    /// Takes the gate out (an open one stays), to hand it to a rebuilt trainer.
    pub fn take_gate(&mut self) -> StepGate {
        std::mem::take(&mut self.gate)
    }

    /// The model being trained.
    pub fn model(&self) -> &M {
        self.optimized.model()
    }

    /// The trained model.
    pub fn into_model(self) -> M {
        self.optimized.into_model()
    }

    /// The settings.
    pub fn config(&self) -> &TrainerConfig {
        &self.config
    }

    /// Completed [`Trainer::train_batch`] calls: the version of the current weights.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Optimizer steps taken (drives the warm-up).
    pub fn optimizer_steps(&self) -> u64 {
        self.optimized.steps()
    }

    /// Trains on one batch: `optimizer_steps` steps of AdamW on the same samples, then the
    /// version advances by one. A batch without any response token takes no step (there is no
    /// gradient) and still advances the version.
    ///
    /// In the stats, `loss` is the mean over the steps of the whole batch's loss before each step,
    /// `clip_fraction` counts clipped tokens over all steps, and `grad_norm` is the last step's
    /// norm before clipping.
    pub fn train_batch(&mut self, samples: &[TrainSample]) -> Result<TrainStats, TrainError> {
        self.check_samples(samples)?;
        let batches = self.prepare(&self.gradient_samples(samples))?;
        let tokens: usize = samples.iter().map(|s| s.response_tokens.len()).sum();
        let mut stats = TrainStats {
            tokens: tokens as u64,
            samples: samples.len() as u64,
            ..TrainStats::default()
        };
        if batches.is_empty() {
            self.version += 1;
            return Ok(stats);
        }
        let steps = self.config.optimizer_steps;
        let mut loss_sum = 0.0;
        let mut clipped = 0u64;
        for _ in 0..steps {
            let started = std::time::Instant::now();
            let g = self.batch_gradients(&batches, samples.len());
            // Ends in a read of the loss: the forward and backward passes have run.
            tracing::debug!(
                gradients_ms = started.elapsed().as_secs_f64() * 1e3,
                micro_batches = batches.len(),
                "learner gradients"
            );
            let step = self.optimized.steps();
            let lr = warmup_lr(self.config.lr, self.config.warmup_steps, step);
            let device = self.model().device();
            let held = self.gate.enter::<B>(&device);
            let norm = self.optimized.step(g.grads, self.config.grad_clip, lr);
            drop(held);
            let norm = norm.map_err(|norm| TrainError::NonFiniteGradient {
                version: self.version,
                step,
                norm,
            })?;
            loss_sum += g.loss;
            clipped += g.clipped;
            stats.grad_norm = norm;
        }
        self.version += 1;
        stats.loss = loss_sum / f64::from(steps);
        stats.clip_fraction = clipped as f64 / (tokens as f64 * f64::from(steps));
        stats.optimizer_steps = steps;
        Ok(stats)
    }

    /// The samples whose tokens the gradient needs. Without a KL term, a sample whose advantage is
    /// zero adds exactly nothing to the loss or its gradient (each token's term is the ratio times
    /// the advantage, clipped or not, and never counts as clipped), so only the others run
    /// forward and backward; Dr. GRPO's normaliser still counts the whole batch
    /// ([`Self::batch_gradients`] takes its size), and the update is the same. In a group whose
    /// trajectories all return the same, every advantage is zero: about five groups in eight of a
    /// step on unseen programs (2026-12-07). A batch with no other sample still takes its
    /// optimizer step (momentum, weight decay) from a gradient of exactly zero: one position of
    /// one sample (its last prompt token and first response token, advantage zero) runs forward
    /// and backward, which gives every weight that zero gradient at the cost of a single token.
    fn gradient_samples<'s>(
        &self,
        samples: &'s [TrainSample],
    ) -> std::borrow::Cow<'s, [TrainSample]> {
        let moves = |s: &TrainSample| s.advantage != 0.0 && !s.response_tokens.is_empty();
        if self.reference.is_some() || samples.iter().all(moves) {
            return std::borrow::Cow::Borrowed(samples);
        }
        let kept: Vec<TrainSample> = samples.iter().filter(|s| moves(s)).cloned().collect();
        if !kept.is_empty() {
            return std::borrow::Cow::Owned(kept);
        }
        // All flat. A sample with a response token has a prompt token (`check_samples`); without
        // any, the batch has no token and takes no step either way.
        match samples.iter().find(|s| !s.response_tokens.is_empty()) {
            Some(s) => std::borrow::Cow::Owned(vec![TrainSample {
                prompt_tokens: s.prompt_tokens[s.prompt_tokens.len() - 1..].to_vec(),
                response_tokens: s.response_tokens[..1].to_vec(),
                behaviour_logprobs: s.behaviour_logprobs[..1].to_vec(),
                advantage: 0.0,
            }]),
            None => std::borrow::Cow::Borrowed(samples),
        }
    }

    /// Forms the micro-batches of checked samples ([`Self::check_samples`], which `train_batch`
    /// runs once over the whole batch, so that an error names the caller's index) with every
    /// per-token constant of the batch: behaviour log-probs, advantages, and the proximal and
    /// reference log-probs when the loss needs them.
    fn prepare(&self, samples: &[TrainSample]) -> Result<Vec<MicroBatch<B>>, TrainError> {
        let mut batches = self.micro_batches(samples)?;
        if self.config.correction == Correction::Decoupled {
            // The proximal policy is the weights at the start of the batch, fixed for all its steps.
            let prox = self.model().valid();
            for mb in &mut batches {
                let _step = self.gate.enter::<B::InnerBackend>(&prox.device());
                mb.prox = Some(token_logprobs(&prox, &mb.tokens));
            }
        }
        if let Some(reference) = &self.reference {
            for mb in &mut batches {
                let _step = self.gate.enter::<B::InnerBackend>(&reference.device());
                mb.reference = Some(token_logprobs(reference, &mb.tokens));
            }
        }
        Ok(batches)
    }

    fn check_samples(&self, samples: &[TrainSample]) -> Result<(), TrainError> {
        let vocab = self.model().vocab_size();
        let max_positions = self.model().max_positions();
        for (index, s) in samples.iter().enumerate() {
            let fail = |reason: String| Err(TrainError::Sample { index, reason });
            if s.behaviour_logprobs.len() != s.response_tokens.len() {
                return fail(format!(
                    "{} behaviour log-probs for {} response tokens",
                    s.behaviour_logprobs.len(),
                    s.response_tokens.len()
                ));
            }
            if s.prompt_tokens.is_empty() && !s.response_tokens.is_empty() {
                return fail(
                    "empty prompt: the first response token needs a token before it".into(),
                );
            }
            if let Some(i) = s.behaviour_logprobs.iter().position(|l| !l.is_finite()) {
                return fail(format!(
                    "behaviour log-prob of response token {i} is {}",
                    s.behaviour_logprobs[i]
                ));
            }
            if !s.advantage.is_finite() {
                return fail(format!("advantage is {}", s.advantage));
            }
            let len = s.prompt_tokens.len() + s.response_tokens.len();
            if len > max_positions {
                return fail(format!(
                    "prompt {} + response {} tokens pass the model's {max_positions} positions",
                    s.prompt_tokens.len(),
                    s.response_tokens.len()
                ));
            }
            let all = s.prompt_tokens.iter().chain(&s.response_tokens);
            if let Some((i, t)) = all.enumerate().find(|(_, &t)| t as usize >= vocab) {
                return fail(format!(
                    "token {t} at position {i} is outside the vocabulary of {vocab}"
                ));
            }
        }
        Ok(())
    }

    fn micro_batches(&self, samples: &[TrainSample]) -> Result<Vec<MicroBatch<B>>, TrainError> {
        let device = self.model().device();
        let multiple = seq_bucket::<B>(&device);
        let rows: Vec<_> = samples
            .iter()
            .map(|s| (s.prompt_tokens.as_slice(), s.response_tokens.as_slice()))
            .collect();
        token_micro_batches(&rows, self.config.micro_batch_tokens, multiple)
            .map(|(indices, tokens)| {
                let tokens = tokens.map_err(|source| TrainError::Batch {
                    samples: indices.clone(),
                    source,
                })?;
                // Row order of the batch is the order of `indices`, and within a row the response
                // tokens are in order: the per-token constants follow the same order.
                let behaviour = indices
                    .iter()
                    .flat_map(|&i| samples[i].behaviour_logprobs.iter().copied())
                    .collect();
                let advantages = indices
                    .iter()
                    .flat_map(|&i| {
                        let s = &samples[i];
                        std::iter::repeat_n(s.advantage as f32, s.response_tokens.len())
                    })
                    .collect();
                Ok(MicroBatch {
                    tokens,
                    behaviour: f32_tensor(behaviour, &device),
                    advantages: f32_tensor(advantages, &device),
                    prox: None,
                    reference: None,
                })
            })
            .collect()
    }

    /// Gradients of the whole batch's loss, summed over its micro-batches, before clipping.
    fn batch_gradients(&self, batches: &[MicroBatch<B>], samples: usize) -> BatchGradients {
        let model = self.model();
        let cfg = &self.config;
        let mut clipped: Option<Tensor<B::InnerBackend, 1, Int>> = None;
        let device = model.device();
        let summed = summed_gradients(model, batches, &self.gate, &device, |mb| {
            let logp = token_logprobs(model, &mb.tokens);
            let behaviour = Tensor::<B, 1>::from_inner(mb.behaviour.clone());
            let advantages = Tensor::<B, 1>::from_inner(mb.advantages.clone());
            // `prepare` sets proximal log-probs exactly when the correction is decoupled.
            let terms = match &mb.prox {
                Some(prox) => decoupled_surrogate(
                    logp.clone(),
                    Tensor::from_inner(prox.clone()),
                    behaviour,
                    advantages,
                    cfg.clip,
                    cfg.decoupled_weight_cap,
                ),
                None => clipped_surrogate(logp.clone(), behaviour, advantages, cfg.clip),
            };
            let mut token_losses = terms.loss;
            if let Some(reference) = &mb.reference {
                let kl = kl_k3(logp, Tensor::from_inner(reference.clone()));
                token_losses = token_losses + kl.mul_scalar(cfg.kl_coef);
            }
            let mb_clipped = terms.clipped.int().sum().inner();
            clipped = Some(match clipped.take() {
                Some(c) => c + mb_clipped,
                None => mb_clipped,
            });
            drgrpo_loss(token_losses, cfg.max_tokens, samples)
        });
        BatchGradients {
            grads: summed.grads,
            loss: summed.loss,
            clipped: clipped.map_or(0, |c| scalar_f64(c.into_data()) as u64),
        }
    }

    /// Writes the optimizer state, the version and the optimizer-step counter into `dir`
    /// ([`crate::optim::OPTIMIZER_FILE`]). The weights are saved separately, with the model.
    pub fn save_optimizer(&self, dir: &Path) -> Result<(), TrainError> {
        self.optimized
            .save(dir, self.version)
            .map_err(checkpoint_error)
    }

    /// Restores what [`Trainer::save_optimizer`] wrote into `dir` (or an earlier kevin's
    /// `learner_optimizer.mpk`) onto the current model, whose parameter paths and shapes must
    /// match those saved.
    pub fn load_optimizer(&mut self, dir: &Path) -> Result<(), TrainError> {
        let device = self.model().device();
        self.version = self
            .optimized
            .load(dir, &device)
            .map_err(checkpoint_error)?;
        Ok(())
    }
}

/// The error of saving or loading the optimizer state: the file and the reason.
fn checkpoint_error((path, reason): (std::path::PathBuf, String)) -> TrainError {
    TrainError::Checkpoint {
        path: path.display().to_string(),
        reason,
    }
}

/// The train samples of a replay batch, turn by turn: each turn's prompt tokenised by `tokenize`
/// (exactly as the generator tokenised it), its response tokens, behaviour log-probs and
/// advantage. Errors name the group, trajectory and turn.
pub fn train_samples(
    batch: &Batch,
    mut tokenize: impl FnMut(&str) -> Result<Vec<u32>, String>,
) -> Result<Vec<TrainSample>, TrainError> {
    let mut samples = Vec::new();
    for g in &batch.groups {
        for (t, trajectory) in g.group.trajectories.iter().enumerate() {
            for (k, turn) in trajectory.iter().enumerate() {
                let index = samples.len();
                let where_ = || format!("group {} trajectory {t} turn {k}", g.seq);
                let advantage = g
                    .advantages
                    .get(t)
                    .and_then(|a| a.get(k))
                    .copied()
                    .ok_or_else(|| TrainError::Sample {
                        index,
                        reason: format!("{}: no advantage", where_()),
                    })?;
                let prompt_tokens = tokenize(&turn.prompt).map_err(|e| TrainError::Sample {
                    index,
                    reason: format!("{}: tokenising the prompt: {e}", where_()),
                })?;
                samples.push(TrainSample {
                    prompt_tokens,
                    response_tokens: turn.response_tokens.clone(),
                    behaviour_logprobs: turn.behaviour_logprobs.clone(),
                    advantage,
                });
            }
        }
    }
    Ok(samples)
}

#[cfg(test)]
#[path = "train_tests.rs"]
mod tests;
