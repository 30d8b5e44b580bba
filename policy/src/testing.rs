//! Test doubles for code written against [`CausalLm`]: a bigram "language model" whose logits
//! depend on the last token only.
//!
//! [`BigramLm`] is a test double, not a model. It exists so the sampler's engine can be tested
//! without weights: its next-token logits are one row of a `[vocab, vocab]` table, so a test
//! knows the exact distribution behind every sampled token. Its cache holds only each slot's
//! length, but it enforces the whole [`CausalLm::extend`] contract (slot range,
//! distinct slots, non-empty rows, tokens in the vocabulary, a slot's `max_len`) and answers a
//! breach with an error naming the slot, so a bookkeeping mistake in the engine (a slot not
//! cleared, one token too many) fails a test instead of passing silently.

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

use crate::CausalLm;

/// A bigram test double: `table[t]` is the logits row after token `t`.
#[derive(Debug, Clone)]
pub struct BigramLm<B: Backend> {
    /// `[vocab, vocab]`: row `t` holds the logits that follow token `t`.
    table: Tensor<B, 2>,
    max_positions: usize,
}

/// The cache of [`BigramLm`]: how many tokens each slot holds. The logits need nothing else,
/// since every row of `extend` ends with the token they depend on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BigramCache {
    max_len: usize,
    lens: Vec<usize>,
}

impl BigramCache {
    /// Tokens held by `slot` (0 when empty).
    pub fn len(&self, slot: usize) -> usize {
        self.lens[slot]
    }

    /// Number of slots that hold a sequence.
    pub fn used_slots(&self) -> usize {
        self.lens.iter().filter(|&&n| n > 0).count()
    }

    /// The longest sequence one slot holds.
    pub fn max_len(&self) -> usize {
        self.max_len
    }
}

impl<B: Backend> BigramLm<B> {
    /// A double with the given logits table (`[vocab, vocab]`).
    ///
    /// # Panics
    /// When the table is not square: a test-setup mistake, not a runtime condition.
    pub fn new(table: Tensor<B, 2>, max_positions: usize) -> Self {
        let [rows, cols] = table.dims();
        assert_eq!(
            rows, cols,
            "BigramLm table must be [vocab, vocab], got [{rows}, {cols}]"
        );
        BigramLm {
            table,
            max_positions,
        }
    }

    /// A double from logits rows given on the host (`rows[t]` follows token `t`).
    pub fn from_rows(rows: &[Vec<f32>], max_positions: usize, device: &B::Device) -> Self {
        let vocab = rows.len();
        let flat: Vec<f32> = rows.iter().flatten().copied().collect();
        assert_eq!(
            flat.len(),
            vocab * vocab,
            "BigramLm rows must all have {vocab} entries"
        );
        let table = Tensor::from_data(TensorData::new(flat, [vocab, vocab]), device);
        Self::new(table, max_positions)
    }

    /// A double whose most likely successor of `t` is `(t + 1) % vocab` (logit `margin`, the
    /// others 0, so greedy decoding counts upwards and sampling stays spread).
    pub fn successor(vocab: usize, margin: f32, max_positions: usize, device: &B::Device) -> Self {
        let rows: Vec<Vec<f32>> = (0..vocab)
            .map(|t| {
                let mut row = vec![0.0; vocab];
                row[(t + 1) % vocab] = margin;
                row
            })
            .collect();
        Self::from_rows(&rows, max_positions, device)
    }

    /// Checks one call of `extend` against the contract; returns each row's last token.
    fn check_extend(
        &self,
        cache: &BigramCache,
        slots: &[usize],
        tokens: &[Vec<u32>],
    ) -> Result<Vec<u32>, String> {
        if slots.len() != tokens.len() {
            return Err(format!(
                "extend: {} slots but {} token rows",
                slots.len(),
                tokens.len()
            ));
        }
        if slots.is_empty() {
            return Err("extend: no rows".to_string());
        }
        let vocab = self.vocab_size();
        let mut seen = vec![false; cache.lens.len()];
        let mut last = Vec::with_capacity(slots.len());
        for (&slot, row) in slots.iter().zip(tokens) {
            if slot >= cache.lens.len() {
                return Err(format!(
                    "extend: slot {slot} out of range (cache has {} slots)",
                    cache.lens.len()
                ));
            }
            if std::mem::replace(&mut seen[slot], true) {
                return Err(format!("extend: slot {slot} appears twice"));
            }
            let Some(&tail) = row.last() else {
                return Err(format!("extend: slot {slot}: empty row"));
            };
            if let Some(&bad) = row.iter().find(|&&t| t as usize >= vocab) {
                return Err(format!(
                    "extend: slot {slot}: token {bad} outside the vocabulary of {vocab}"
                ));
            }
            let len = cache.lens[slot] + row.len();
            if len > cache.max_len {
                return Err(format!(
                    "extend: slot {slot}: {} cached + {} new tokens pass max_len {}",
                    cache.lens[slot],
                    row.len(),
                    cache.max_len
                ));
            }
            last.push(tail);
        }
        Ok(last)
    }
}

impl<B: Backend> CausalLm<B> for BigramLm<B> {
    type Cache = BigramCache;

    fn vocab_size(&self) -> usize {
        self.table.dims()[0]
    }

    fn max_positions(&self) -> usize {
        self.max_positions
    }

    fn device(&self) -> B::Device {
        self.table.device()
    }

    fn new_cache(&self, slots: usize, max_len: usize) -> BigramCache {
        BigramCache {
            max_len,
            lens: vec![0; slots],
        }
    }

    fn extend(
        &self,
        cache: &mut BigramCache,
        slots: &[usize],
        tokens: &[Vec<u32>],
    ) -> Result<Tensor<B, 2>, String> {
        let last = self.check_extend(cache, slots, tokens)?;
        for (&slot, row) in slots.iter().zip(tokens) {
            cache.lens[slot] += row.len();
        }
        let idx: Vec<i64> = last.iter().map(|&t| i64::from(t)).collect();
        let n = idx.len();
        let idx = Tensor::<B, 1, Int>::from_data(TensorData::new(idx, [n]), &self.device());
        Ok(self.table.clone().select(0, idx))
    }

    fn clear_slot(&self, cache: &mut BigramCache, slot: usize) {
        cache.lens[slot] = 0;
    }

    fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let [batch, seq] = tokens.dims();
        let flat = tokens.reshape([batch * seq]);
        let vocab = self.vocab_size();
        self.table
            .clone()
            .select(0, flat)
            .reshape([batch, seq, vocab])
    }
}
