//! The learner's loss on tensors: response-token log-probs through [`CausalLm::forward`], the
//! clipped surrogate with clip-higher, the decoupled off-policy objective, the k3 KL estimator and
//! Dr. GRPO's constant normalisation.
//!
//! Every formula here is the tensor twin of a scalar function in `kevin::rl` (the trusted
//! reference) and is tested against it on random inputs. Tensors of per-token values are flat
//! `[N]`: the response tokens of a [`TokenBatch`], row by row, in sequence order. Only response
//! tokens are ever selected, so nothing downstream needs a mask.
//!
//! Precision: logits are cast to f32 before the log-softmax (a no-op on an f32 backend), and every
//! per-token tensor this module builds from host data is f32, whatever the backend's default float
//! type: a log-softmax over 151936 logits loses too much in bf16.

use burn::tensor::backend::Backend;
use burn::tensor::{Bool, DType, FloatDType, Tensor, TensorData};
use kevin::rl::{self, Clip};

use crate::CausalLm;

/// Id written into padded positions. Any valid id would do: with causal attention a padded
/// position after a row's last token cannot change the logits of that row's earlier positions,
/// and padded positions are never selected as predictions.
pub const PAD: u32 = 0;

/// A malformed micro-batch of sequences.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BatchError {
    /// The ids, the mask and the declared shape disagree.
    #[error(
        "token batch: {what} has {got} entries, expected rows {rows} x seq {seq} = {expected}"
    )]
    Shape {
        /// Which input (`tokens` or `mask`).
        what: &'static str,
        /// Its length.
        got: usize,
        /// rows * seq.
        expected: usize,
        /// Declared rows.
        rows: usize,
        /// Declared sequence length.
        seq: usize,
    },
    /// A response token at position 0 has nothing to be predicted from.
    #[error("token batch row {row}: token 0 is marked as a response token, but a response token needs at least one token before it")]
    NoContext {
        /// The row.
        row: usize,
    },
    /// The batch holds no response token at all: there is nothing to score.
    #[error("token batch of {rows} rows has no response token")]
    NoResponse {
        /// Rows in the batch.
        rows: usize,
    },
    /// A token id the model's vocabulary does not have.
    #[error("token batch row {row}, position {position}: token id {token} is outside the vocabulary of {vocab}")]
    TokenOutOfVocab {
        /// The row.
        row: usize,
        /// Its position in the row.
        position: usize,
        /// The id.
        token: u32,
        /// Vocabulary size.
        vocab: usize,
    },
}

/// Right-padded prompt + response ids of a micro-batch and where its response tokens sit.
///
/// Response token `t` of row `r` is predicted by the logits at position `t - 1`, so the batch
/// keeps, for every response token in row-major order, the flat index `r * seq + t - 1` of its
/// predicting position and the token id itself.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenBatch {
    tokens: Vec<i64>,
    rows: usize,
    seq: usize,
    predict_at: Vec<i64>,
    targets: Vec<i64>,
}

impl TokenBatch {
    /// Rows of (prompt, response), right-padded with [`PAD`] to the longest row. A row may have
    /// an empty response (it contributes nothing); a non-empty response needs a non-empty
    /// prompt, and at least one row must have a response.
    pub fn from_sequences<'a>(
        rows: impl IntoIterator<Item = (&'a [u32], &'a [u32])>,
    ) -> Result<Self, BatchError> {
        let rows: Vec<(&[u32], &[u32])> = rows.into_iter().collect();
        let seq = rows
            .iter()
            .map(|(p, r)| p.len() + r.len())
            .max()
            .unwrap_or(0);
        let mut tokens = vec![PAD; rows.len() * seq];
        let mut mask = vec![false; rows.len() * seq];
        for (i, (prompt, response)) in rows.iter().enumerate() {
            let row = &mut tokens[i * seq..(i + 1) * seq];
            row[..prompt.len()].copy_from_slice(prompt);
            row[prompt.len()..prompt.len() + response.len()].copy_from_slice(response);
            mask[i * seq + prompt.len()..i * seq + prompt.len() + response.len()].fill(true);
        }
        Self::from_mask(&tokens, rows.len(), seq, &mask)
    }

    /// Padded ids `[rows, seq]` (row-major) and a loss mask of the same shape that is true exactly
    /// at the response tokens.
    pub fn from_mask(
        tokens: &[u32],
        rows: usize,
        seq: usize,
        mask: &[bool],
    ) -> Result<Self, BatchError> {
        let expected = rows * seq;
        for (what, got) in [("tokens", tokens.len()), ("mask", mask.len())] {
            if got != expected {
                return Err(BatchError::Shape {
                    what,
                    got,
                    expected,
                    rows,
                    seq,
                });
            }
        }
        let mut predict_at = Vec::new();
        let mut targets = Vec::new();
        for r in 0..rows {
            if seq > 0 && mask[r * seq] {
                return Err(BatchError::NoContext { row: r });
            }
            for t in 1..seq {
                let i = r * seq + t;
                if mask[i] {
                    predict_at.push((i - 1) as i64);
                    targets.push(i64::from(tokens[i]));
                }
            }
        }
        if targets.is_empty() {
            return Err(BatchError::NoResponse { rows });
        }
        Ok(TokenBatch {
            tokens: tokens.iter().map(|&t| i64::from(t)).collect(),
            rows,
            seq,
            predict_at,
            targets,
        })
    }

    /// The same batch with every row right-padded further, to a sequence length that is a
    /// multiple of `multiple` (unchanged for 0 or 1). On a backend that compiles kernels per
    /// shape ([`crate::qwen2::compiles_per_shape`]) the learner then meets a few lengths instead
    /// of a new one every step; the padding is never predicted, so the loss is unchanged.
    pub fn padded_to_multiple(self, multiple: usize) -> Self {
        if multiple <= 1 || self.seq == 0 || self.seq % multiple == 0 {
            return self;
        }
        let seq = self.seq.next_multiple_of(multiple);
        let mut tokens = vec![i64::from(PAD); self.rows * seq];
        for (r, row) in self.tokens.chunks(self.seq).enumerate() {
            tokens[r * seq..r * seq + self.seq].copy_from_slice(row);
        }
        let old = self.seq as i64;
        let predict_at = self
            .predict_at
            .iter()
            .map(|&i| i / old * seq as i64 + i % old)
            .collect();
        TokenBatch {
            tokens,
            rows: self.rows,
            seq,
            predict_at,
            targets: self.targets,
        }
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Padded sequence length.
    pub fn seq_len(&self) -> usize {
        self.seq
    }

    /// Positions the forward pass computes: rows * seq, padding included.
    pub fn padded_tokens(&self) -> usize {
        self.rows * self.seq
    }

    /// Response tokens: the length N of every per-token tensor of this batch.
    pub fn response_tokens(&self) -> usize {
        self.targets.len()
    }

    /// Checks every id (padding and prompts included) against a vocabulary of `vocab` ids.
    pub fn check_vocab(&self, vocab: usize) -> Result<(), BatchError> {
        match self.tokens.iter().position(|&t| t as usize >= vocab) {
            None => Ok(()),
            Some(i) => Err(BatchError::TokenOutOfVocab {
                row: i / self.seq,
                position: i % self.seq,
                token: self.tokens[i] as u32,
                vocab,
            }),
        }
    }
}

/// A flat f32 tensor `[N]` on `device` from host values, whatever the backend's default float.
pub fn f32_tensor<B: Backend>(values: Vec<f32>, device: &B::Device) -> Tensor<B, 1> {
    let n = values.len();
    Tensor::from_data(TensorData::new(values, [n]), (device, DType::F32))
}

/// log p(token | tokens before it) of every response token of `batch` under `model`: `[N]`, f32.
///
/// Differentiable when `B` is an autodiff backend; call it on `model.valid()` for values without
/// a graph. Token ids must be inside the model's vocabulary ([`TokenBatch::check_vocab`]).
///
/// Memory: the model's `[rows, seq, vocab]` logits are the one unavoidable copy. On burn's CUDA
/// backend nothing else of that size is kept: [`crate::logprob`]'s kernels read the N predicting
/// rows in place and write the gradient once. Elsewhere only the N predicting rows are selected
/// (`[N, vocab]`, prompt and padding positions dropped) before the
/// log-softmax, and the log-softmax is never materialised: the target logit is gathered and the
/// log-sum-exp subtracted, so the graph keeps one `[N, vocab]` tensor (the exponentials, for the
/// backward pass) instead of a full log-softmax output.
pub fn token_logprobs<B, M>(model: &M, batch: &TokenBatch) -> Tensor<B, 1>
where
    B: Backend,
    M: CausalLm<B> + ?Sized,
{
    let device = model.device();
    let n = batch.response_tokens();
    let tokens =
        crate::qwen2::int_tensor::<B, 2>(batch.tokens.clone(), [batch.rows, batch.seq], &device);
    let logits = model.forward(tokens); // [rows, seq, vocab]
    let at = crate::qwen2::int_tensor::<B, 1>(batch.predict_at.clone(), [n], &device);
    let targets = crate::qwen2::int_tensor::<B, 1>(batch.targets.clone(), [n], &device);
    // `predict_at` is strictly increasing (`TokenBatch::new`), so its rows are distinct.
    let (logits, at, _) = match crate::logprob::chosen_logprobs(logits, at, targets) {
        Ok(logp) => return logp,
        Err(operands) => operands,
    };
    let logits = logits.cast(FloatDType::F32);
    let vocab = logits.dims()[2];
    // The N predicting rows, [N, vocab].
    let predicting = logits
        .reshape([batch.rows * batch.seq, vocab])
        .select(0, at);
    // Subtracting the (constant) row maximum keeps exp finite; it cancels out of the result.
    let max = predicting.clone().detach().max_dim(1); // [N, 1]
    let shifted = predicting - max; // [N, vocab]
    let target = shifted.clone().gather(
        1,
        crate::qwen2::int_tensor::<B, 2>(batch.targets.clone(), [n, 1], &device),
    ); // [N, 1]
    let log_sum_exp = shifted.exp().sum_dim(1).log(); // [N, 1]
    (target - log_sum_exp).reshape([n])
}

/// Per-token losses of a surrogate objective, and which tokens took the constant clipped branch.
#[derive(Debug, Clone)]
pub struct TokenLosses<B: Backend> {
    /// Loss of every token `[N]` (what `kevin::rl::TokenLoss::loss` is per token).
    pub loss: Tensor<B, 1>,
    /// True where the clipped branch was chosen and carries no gradient
    /// (`kevin::rl::TokenLoss::clipped`).
    pub clipped: Tensor<B, 1, Bool>,
}

/// min(r * A, clip(r) * A) per token, and where the clipped branch won.
///
/// As in `kevin::rl`, the clipped branch is taken only when it is strictly smaller; then the ratio
/// lies outside the clip range and the branch is a constant, so it is detached: its gradient is
/// exactly zero by construction, not by the backward pass of `clamp` at the boundary.
fn clipped_objective<B: Backend>(
    ratio: Tensor<B, 1>,
    advantage: Tensor<B, 1>,
    clip: Clip,
) -> (Tensor<B, 1>, Tensor<B, 1, Bool>) {
    let unclipped = ratio.clone() * advantage.clone();
    let clipped = (ratio.clamp(1.0 - clip.eps_low, 1.0 + clip.eps_high) * advantage).detach();
    let take_clipped = clipped.clone().lower(unclipped.clone());
    (
        unclipped.mask_where(take_clipped.clone(), clipped),
        take_clipped,
    )
}

/// The clipped surrogate with clip-higher against the behaviour policy, per token:
/// -min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A) with r = exp(logp_new - logp_behaviour).
/// The tensor form of `kevin::rl::clipped_surrogate`.
pub fn clipped_surrogate<B: Backend>(
    logp_new: Tensor<B, 1>,
    logp_behaviour: Tensor<B, 1>,
    advantage: Tensor<B, 1>,
    clip: Clip,
) -> TokenLosses<B> {
    let ratio = (logp_new - logp_behaviour.detach()).exp();
    let (objective, clipped) = clipped_objective(ratio, advantage, clip);
    TokenLosses {
        loss: objective.neg(),
        clipped,
    }
}

/// The decoupled objective per token: the ratio is taken against the proximal policy (`logp_prox`,
/// the weights at the start of the batch; treated as a constant) and the term is weighted by
/// min(pi_prox / pi_behaviour, weight_cap). The tensor form of `kevin::rl::decoupled_surrogate`.
pub fn decoupled_surrogate<B: Backend>(
    logp_new: Tensor<B, 1>,
    logp_prox: Tensor<B, 1>,
    logp_behaviour: Tensor<B, 1>,
    advantage: Tensor<B, 1>,
    clip: Clip,
    weight_cap: f64,
) -> TokenLosses<B> {
    let logp_prox = logp_prox.detach();
    let ratio = (logp_new - logp_prox.clone()).exp();
    let weight = (logp_prox - logp_behaviour.detach())
        .exp()
        .clamp_max(weight_cap);
    let (objective, clipped) = clipped_objective(ratio, advantage, clip);
    TokenLosses {
        loss: (objective * weight).neg(),
        clipped,
    }
}

/// The k3 estimator of KL(pi_theta || pi_ref) per token (Schulman's low-variance, always
/// non-negative estimator): exp(d) - d - 1 with d = logp_ref - logp_new; `logp_ref` is a constant.
pub fn kl_k3<B: Backend>(logp_new: Tensor<B, 1>, logp_ref: Tensor<B, 1>) -> Tensor<B, 1> {
    let d = logp_ref.detach() - logp_new;
    d.clone().exp() - d - 1.0
}

/// Dr. GRPO's constant normalisation: the sum of `token_losses` (any subset of a batch's tokens)
/// divided by `kevin::rl::drgrpo_normalizer(max_tokens, samples)`, where `samples` counts the
/// whole batch. Because the divisor is a constant, summing this over micro-batches gives exactly
/// the loss of the whole batch: micro-batching does not change the gradient.
pub fn drgrpo_loss<B: Backend>(
    token_losses: Tensor<B, 1>,
    max_tokens: usize,
    samples: usize,
) -> Tensor<B, 1> {
    token_losses
        .sum()
        .div_scalar(rl::drgrpo_normalizer(max_tokens, samples))
}

#[cfg(test)]
#[path = "loss_tests.rs"]
mod tests;
