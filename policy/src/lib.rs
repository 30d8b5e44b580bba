//! kevin's policy in burn: a Qwen2-architecture decoder, Hugging Face checkpoints, batched
//! sampling with a KV cache, and the learner that trains it from the replay queue.
//!
//! The pieces meet at [`CausalLm`]: the sampler drives any model through it (a test double in
//! unit tests, `Qwen2` for real), and the learner differentiates through its `forward`.
#![warn(missing_docs)]

pub mod bench;
pub mod burn_learner;
pub mod burn_policy;
pub mod chat;
pub mod checkpoint;
pub mod cublas;
pub mod cuda_setup;
pub mod flash;
pub mod gate;
pub mod grad_norm;
pub mod kernels;
pub mod learner_testing;
pub mod logprob;
pub mod loss;
pub mod norm;
pub mod optim;
pub mod parity;
pub mod qwen2;
pub mod runtime;
pub mod sampler;
pub mod sft;
pub mod stream;
pub mod testing;
pub mod tokenizer;
pub mod train;

pub use checkpoint::{CheckpointError, SaveDtype};
pub use qwen2::{ConfigError, Qwen2, Qwen2Cache, Qwen2Config};

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};

/// How one row's token is chosen on the device ([`CausalLm::extend_draw`]): greedy
/// (`temperature` 0: the first most likely token) or drawn from softmax(logits / temperature)
/// over the whole vocabulary by inverting its CDF at `uniform` in [0, 1) (see
/// [`sampler::RowChoice::uniform`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceDraw {
    /// Softmax temperature; 0 is greedy.
    pub temperature: f64,
    /// The row's uniform number.
    pub uniform: f64,
}

/// What generation and learning need from a causal language model.
///
/// Generation works on a cache of fixed *slots*, each holding one sequence's keys and values, so
/// that sequences of different lengths (a new prompt being prefilled next to sequences decoding
/// one token a step) share one forward pass: continuous batching.
pub trait CausalLm<B: Backend> {
    /// The KV cache of [`CausalLm::extend`].
    type Cache;

    /// Size of the vocabulary (the logits' last dimension).
    fn vocab_size(&self) -> usize;

    /// Longest sequence (prompt + response) the model can attend over.
    fn max_positions(&self) -> usize;

    /// The device the weights live on.
    fn device(&self) -> B::Device;

    /// An empty cache of `slots` sequences of at most `max_len` tokens each.
    fn new_cache(&self, slots: usize, max_len: usize) -> Self::Cache;

    /// Appends `tokens[i]` to the sequence held in slot `slots[i]` (distinct slots, each row at
    /// least one token; an empty slot starts a new sequence at position 0) and returns, for every
    /// row, the logits after its last new token: `[rows, vocab]`, f32. A row that would pass the
    /// slot's `max_len` is an error naming the slot.
    fn extend(
        &self,
        cache: &mut Self::Cache,
        slots: &[usize],
        tokens: &[Vec<u32>],
    ) -> Result<Tensor<B, 2>, String>;

    /// [`CausalLm::extend`] with each row's token chosen on the device, where the model can
    /// (the fused path on CUDA): `draws[i]` says how row `i` chooses. `Ok(None)` when it cannot,
    /// and then nothing ran (the caller extends and selects from the logits). `Ok(Some)`: per row
    /// the token and its log-prob under the distribution drawn from, as
    /// [`sampler::select_tokens`] defines them (NaN for a row whose logits are not a
    /// distribution); the pass's device work has then finished (nothing of it is left queued),
    /// so the caller releases the GPU timing lease without waiting for the device
    /// ([`gate::GateGuard::settled`]).
    fn extend_draw(
        &self,
        cache: &mut Self::Cache,
        slots: &[usize],
        tokens: &[Vec<u32>],
        draws: &[DeviceDraw],
    ) -> Result<Option<Vec<(u32, f32)>>, String> {
        let _ = (cache, slots, tokens, draws);
        Ok(None)
    }

    /// Empties a slot (its sequence finished) so a new sequence can start in it.
    fn clear_slot(&self, cache: &mut Self::Cache, slot: usize);

    /// Causal logits at every position of `tokens` `[batch, seq]`, without a cache:
    /// `[batch, seq, vocab]`. Rows are right-padded by the caller; the logits at padded positions
    /// are meaningless and the caller masks them out. The learner differentiates through this.
    fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3>;
}
