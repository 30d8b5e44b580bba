//! The KV cache: fixed slots of flat per-layer keys and values, shape bucketing, and the plan
//! one `extend` call shares across layers.

use burn::tensor::backend::Backend;
use burn::tensor::{Bool, IndexingUpdateOp, Int, Tensor, TensorData};

use super::layers::Rope;

/// Keys and values of one layer for every slot, flattened: `[slots * kv * max_len, d]` each
/// (slot-major, then head, then position).
///
/// Flat, so that no step reshapes the whole cache: burn-ndarray copies on every reshape, which
/// made each decoded token copy the cache twice per layer (a 4M-parameter model decoded at
/// minutes per 2048 tokens on a CPU). Writes are an indexed add into it and reads a gather.
///
/// Invariant: positions at or past a slot's length hold zeros, because new entries are written
/// with an indexed *add* (burn 0.21's only indexed update on every backend). `clear_slot`
/// restores the zeros.
#[derive(Debug, Clone)]
pub(super) struct LayerKv<B: Backend> {
    pub(super) k: Tensor<B, 2>,
    pub(super) v: Tensor<B, 2>,
}

/// The KV cache of [`Qwen2`]: fixed slots, each holding one sequence of at most `max_len` tokens.
///
/// `max_len` is the caller's choice and is not bounded by `max_position_embeddings` (RoPE goes on
/// past it; the model was not trained there). Slot indices out of range are an error in
/// `extend` and a panic in `clear_slot` (a caller's bug, not data).
#[derive(Debug)]
pub struct Qwen2Cache<B: Backend> {
    pub(super) layers: Vec<LayerKv<B>>,
    /// Tokens held by each slot.
    pub(super) lens: Vec<usize>,
    pub(super) max_len: usize,
    /// Whether `extend` rounds its shapes up (see [`Qwen2Cache::set_bucketed`]).
    pub(super) bucketed: bool,
    /// The fused path's engine and key/value memory ([`super::fused`]), where it serves; then
    /// `layers` is empty and bucketing does not apply (no token is padded).
    pub(super) fused: Option<super::fused::Fused>,
}

/// Attended keys are rounded up to a multiple of this when shapes are bucketed.
pub const KEY_BUCKET: usize = 128;
/// New tokens per row are rounded up to a multiple of this (prefill only) when bucketed.
pub const TOKEN_BUCKET: usize = 16;

/// True for backends that compile kernels for the shapes they meet (burn's cubecl backends:
/// CUDA, wgpu, ...), where [`Qwen2Cache`] buckets its shapes by default.
pub fn compiles_per_shape<B: Backend>(device: &B::Device) -> bool {
    B::name(device).contains("cubecl")
}

/// `n` rounded up to a multiple of `bucket`, at most `cap` (and at least `n`).
pub(super) fn round_up(n: usize, bucket: usize, cap: usize) -> usize {
    n.div_ceil(bucket).saturating_mul(bucket).min(cap).max(n)
}

impl<B: Backend> Qwen2Cache<B> {
    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.lens.len()
    }

    /// Tokens each slot can hold.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Tokens held by `slot` (0 when empty).
    pub fn len(&self, slot: usize) -> usize {
        self.lens[slot]
    }

    /// Whether `extend` rounds the shapes it computes with up to a few buckets: attended keys
    /// to a multiple of [`KEY_BUCKET`] (the extra keys are masked), rows to a power of two
    /// (padding rows sit in slots the call does not touch; nothing is written for them and
    /// their logits are dropped) and, when a row brings more than one token, tokens per row to
    /// a multiple of [`TOKEN_BUCKET`] (padding queries, dropped). Results are the same either
    /// way (tested); on a backend that compiles kernels per shape, a decode step then meets a
    /// handful of shapes instead of a new one every token. On by default exactly where
    /// [`compiles_per_shape`].
    pub fn set_bucketed(&mut self, on: bool) {
        self.bucketed = on;
    }

    /// See [`Qwen2Cache::set_bucketed`].
    pub fn bucketed(&self) -> bool {
        self.bucketed
    }

    /// Counts `tokens[i]` into slot `slots[i]`'s length (after an `extend` wrote them).
    pub(super) fn advance(&mut self, slots: &[usize], tokens: &[Vec<u32>]) {
        for (&slot, toks) in slots.iter().zip(tokens) {
            self.lens[slot] += toks.len();
        }
    }

    /// Whether `extend` takes the fused path ([`super::fused`]) with this cache.
    pub fn is_fused(&self) -> bool {
        self.fused.is_some()
    }
}

/// What every layer of one `extend` call shares: where the new keys go, which slots each row
/// reads, the mask and the RoPE angles.
pub(super) struct ExtendPlan<B: Backend> {
    /// `[rows * kv * keys]`: the cache rows each row attends, as `[rows, kv, keys]` flattened.
    pub(super) read: Tensor<B, 1, Int>,
    /// `[written]`: indices into the new keys flattened as `[rows * kv * t, d]`; padding skipped.
    pub(super) src: Tensor<B, 1, Int>,
    /// `[written]`: where each goes in the cache flattened as `[slots * kv * max_len, d]`.
    pub(super) dst: Tensor<B, 1, Int>,
    /// Keys attended: the longest slot after the write.
    pub(super) keys: usize,
    /// `[rows, 1, t, keys]`, true where a query may not look.
    pub(super) masked: Tensor<B, 4, Bool>,
    pub(super) rope: Rope<B>,
}

impl<B: Backend> ExtendPlan<B> {
    /// `cache [slots * kv * max_len, d]`, `new [rows, kv, t, d]` -> cache with the new entries.
    pub(super) fn write(&self, cache: Tensor<B, 2>, new: Tensor<B, 4>) -> Tensor<B, 2> {
        let [rows, kv, t, d] = new.dims();
        let new = new.reshape([rows * kv * t, d]).select(0, self.src.clone());
        cache.select_assign(0, self.dst.clone(), new, IndexingUpdateOp::Add)
    }
}

/// An integer tensor of `shape` from host values (token ids, positions, indices).
pub(crate) fn int_tensor<B: Backend, const D: usize>(
    values: Vec<i64>,
    shape: [usize; D],
    device: &B::Device,
) -> Tensor<B, D, Int> {
    Tensor::from_data(TensorData::new(values, shape), device)
}
