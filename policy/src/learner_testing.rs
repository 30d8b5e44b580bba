//! A test double of a causal language model: a bigram model (an embedding of the current token
//! and a linear head to the next token's logits), small enough for the learner's tests on the CPU.
//!
//! It is a real, trainable [`CausalLm`]: `forward` is causal (each position sees only its own
//! token), and `extend` keeps an honest per-slot cache of the tokens so far and answers with the
//! logits after each row's last token. It is named as a test double so nobody mistakes it for a
//! policy.

use burn::module::{Module, Param};
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

use crate::CausalLm;

/// The bigram test double.
#[derive(Module, Debug)]
pub struct BigramTestLm<B: Backend> {
    /// Token embeddings `[vocab, hidden]`.
    embed: Embedding<B>,
    /// Next-token head `[hidden, vocab]` with a bias.
    head: Linear<B>,
    /// Longest sequence accepted by `extend`.
    max_positions: usize,
}

/// The cache of [`BigramTestLm::extend`]: the tokens of each slot's sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BigramTestCache {
    slots: Vec<Vec<u32>>,
    max_len: usize,
}

impl<B: Backend> BigramTestLm<B> {
    /// A randomly initialised double with `vocab` tokens and a hidden size of `hidden`.
    pub fn new(vocab: usize, hidden: usize, max_positions: usize, device: &B::Device) -> Self {
        BigramTestLm {
            embed: EmbeddingConfig::new(vocab, hidden).init(device),
            head: LinearConfig::new(hidden, vocab).init(device),
            max_positions,
        }
    }

    /// A double with the given weights (`embed` `[vocab, hidden]`, `head` `[hidden, vocab]`,
    /// `bias` `[vocab]`) under fresh parameter ids, as a model loaded from a checkpoint in a new
    /// process would have.
    pub fn from_weights(
        embed: Tensor<B, 2>,
        head: Tensor<B, 2>,
        bias: Tensor<B, 1>,
        max_positions: usize,
    ) -> Self {
        BigramTestLm {
            embed: Embedding {
                weight: Param::from_tensor(embed),
            },
            head: Linear {
                weight: Param::from_tensor(head),
                bias: Some(Param::from_tensor(bias)),
            },
            max_positions,
        }
    }

    /// A copy of the weights under fresh parameter ids, drawn now (a lazily initialised double's
    /// clones would each draw their own), as a model reloaded in a new process has them.
    pub fn reloaded(&self) -> Self {
        let (e, h, b) = self.weights();
        BigramTestLm::from_weights(e.detach(), h.detach(), b.detach(), self.max_positions)
    }

    /// Every weight's value: the embedding, the head, the bias, each row-major.
    pub fn weight_values(&self) -> Vec<f32> {
        let (e, h, b) = self.weights();
        [e.into_data(), h.into_data(), b.into_data()]
            .iter()
            .flat_map(|d| d.iter::<f32>().collect::<Vec<_>>())
            .collect()
    }

    /// The weights, as [`BigramTestLm::from_weights`] takes them.
    pub fn weights(&self) -> (Tensor<B, 2>, Tensor<B, 2>, Tensor<B, 1>) {
        let bias = match &self.head.bias {
            Some(b) => b.val(),
            None => Tensor::zeros([self.vocab_size()], &self.embed.weight.device()),
        };
        (self.embed.weight.val(), self.head.weight.val(), bias)
    }
}

impl<B: Backend> CausalLm<B> for BigramTestLm<B> {
    type Cache = BigramTestCache;

    fn vocab_size(&self) -> usize {
        self.embed.weight.dims()[0]
    }

    fn max_positions(&self) -> usize {
        self.max_positions
    }

    fn device(&self) -> B::Device {
        self.embed.weight.device()
    }

    fn new_cache(&self, slots: usize, max_len: usize) -> BigramTestCache {
        BigramTestCache {
            slots: vec![Vec::new(); slots],
            max_len,
        }
    }

    fn extend(
        &self,
        cache: &mut BigramTestCache,
        slots: &[usize],
        tokens: &[Vec<u32>],
    ) -> Result<Tensor<B, 2>, String> {
        if slots.len() != tokens.len() || slots.is_empty() {
            return Err(format!(
                "extend: {} slots for {} token rows (need as many, at least one)",
                slots.len(),
                tokens.len()
            ));
        }
        for (i, (&slot, row)) in slots.iter().zip(tokens).enumerate() {
            if slot >= cache.slots.len() {
                return Err(format!(
                    "slot {slot}: the cache has {} slots",
                    cache.slots.len()
                ));
            }
            if slots[..i].contains(&slot) {
                return Err(format!("slot {slot}: appears twice in one extend"));
            }
            if row.is_empty() {
                return Err(format!("slot {slot}: no token to append"));
            }
            if cache.slots[slot].len() + row.len() > cache.max_len {
                return Err(format!(
                    "slot {slot}: {} + {} tokens pass the slot's max_len {}",
                    cache.slots[slot].len(),
                    row.len(),
                    cache.max_len
                ));
            }
        }
        let last: Vec<i64> = slots
            .iter()
            .zip(tokens)
            .map(|(&slot, row)| {
                cache.slots[slot].extend_from_slice(row);
                i64::from(*row.last().expect("rows are non-empty"))
            })
            .collect();
        let rows = last.len();
        let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(last, [rows, 1]), &self.device());
        let vocab = self.vocab_size();
        Ok(self.forward(ids).reshape([rows, vocab]))
    }

    fn clear_slot(&self, cache: &mut BigramTestCache, slot: usize) {
        if let Some(s) = cache.slots.get_mut(slot) {
            s.clear();
        }
    }

    fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        // [batch, seq] -> [batch, seq, hidden] -> [batch, seq, vocab]
        self.head.forward(self.embed.forward(tokens))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::NdArray;

    type B = NdArray;

    #[test]
    fn extend_matches_forward_at_each_rows_last_token() {
        let device = Default::default();
        let lm = BigramTestLm::<B>::new(7, 4, 16, &device);
        let mut cache = lm.new_cache(3, 5);
        let got = lm
            .extend(&mut cache, &[2, 0], &[vec![1, 2, 3], vec![4]])
            .unwrap();
        let want = lm.forward(Tensor::from_data(
            TensorData::new(vec![3i64, 4], [2, 1]),
            &device,
        ));
        got.into_data()
            .assert_approx_eq::<f32>(&want.reshape([2, 7]).into_data(), Default::default());
        // Slot 2 holds 3 tokens of 5: 3 more pass max_len.
        let err = lm.extend(&mut cache, &[2], &[vec![1, 1, 1]]).unwrap_err();
        assert!(err.contains("slot 2"), "{err}");
        lm.clear_slot(&mut cache, 2);
        assert!(lm.extend(&mut cache, &[2], &[vec![1, 1, 1]]).is_ok());
    }
}
