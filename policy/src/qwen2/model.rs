//! The model: [`Qwen2`] built from its weights, its logits, and the [`CausalLm`] implementation
//! (full forward and the cached `extend` of batched generation).

use burn::module::{Module, Param};
use burn::nn::{Embedding, Linear};
use burn::tensor::backend::Backend;
use burn::tensor::module::linear;
use burn::tensor::{Bool, Int, Tensor};

use super::cache::{
    compiles_per_shape, int_tensor, round_up, ExtendPlan, LayerKv, Qwen2Cache, KEY_BUCKET,
    TOKEN_BUCKET,
};
use super::config::{ConfigError, Qwen2Config};
use super::fused;
use super::layers::{lin, mm, on_rows, to_f32, DecoderLayer, RmsNorm, Rope};
use super::weights::{
    linear_from, visit_linear, RandomInit, WeightKind, WeightSource, WeightVisitor,
};
use crate::CausalLm;

/// The Qwen2 causal language model (transformers' `Qwen2ForCausalLM`).
#[derive(Module, Debug)]
pub struct Qwen2<B: Backend> {
    pub(super) embed_tokens: Embedding<B>,
    pub(super) layers: Vec<DecoderLayer<B>>,
    pub(super) norm: RmsNorm<B>,
    /// `None` when tied to `embed_tokens`.
    pub(super) lm_head: Option<Linear<B>>,
    /// The architecture, kept for RoPE and the cache; not a parameter.
    #[module(skip)]
    config: Qwen2Config,
    /// Split f32 matmuls (see [`Qwen2::set_split_f32_matmul`]).
    split: bool,
}

impl<B: Backend> Qwen2<B> {
    /// A randomly initialised model (as transformers initialises one) on `device`.
    pub fn new(cfg: &Qwen2Config, device: &B::Device) -> Result<Self, ConfigError> {
        cfg.validate()?;
        let mut init = RandomInit {
            device,
            std: cfg.initializer_range,
        };
        match Self::from_weights(cfg, &mut init) {
            Ok(model) => Ok(model),
            Err(never) => match never {},
        }
    }

    /// Builds the model from `src` under Hugging Face's names; `cfg` must be valid.
    pub(crate) fn from_weights<S: WeightSource<B>>(
        cfg: &Qwen2Config,
        src: &mut S,
    ) -> Result<Self, S::Error> {
        let (vocab, hidden) = (cfg.vocab_size, cfg.hidden_size);
        let embed = src.get(
            "model.embed_tokens.weight",
            [vocab, hidden],
            WeightKind::Embedding,
        )?;
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| DecoderLayer::new(src, &format!("model.layers.{i}"), cfg))
            .collect::<Result<_, _>>()?;
        let norm = RmsNorm::new(src, "model.norm", hidden, cfg.rms_norm_eps)?;
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            Some(linear_from(src, "lm_head", hidden, vocab, false)?)
        };
        Ok(Self {
            embed_tokens: Embedding {
                weight: Param::from_tensor(embed),
            },
            layers,
            norm,
            lm_head,
            config: cfg.clone(),
            split: false,
        })
    }

    /// Calls `f` with every weight (Hugging Face name, data in burn's layout, kind), in the
    /// order of the checkpoint's names; `lm_head.weight` only when untied.
    pub(crate) fn visit_weights(&self, f: &mut WeightVisitor<'_>) {
        f(
            "model.embed_tokens.weight",
            self.embed_tokens.weight.val().into_data(),
            WeightKind::Embedding,
        );
        for (i, layer) in self.layers.iter().enumerate() {
            layer.visit(&format!("model.layers.{i}"), f);
        }
        self.norm.visit("model.norm", f);
        if let Some(head) = &self.lm_head {
            visit_linear(head, "lm_head", f);
        }
    }

    /// The dtype of the model's weights (the embedding's; every weight is made in one).
    pub fn dtype(&self) -> burn::tensor::DType {
        self.embed_tokens.weight.val().dtype()
    }

    /// The architecture this model was built with.
    pub fn config(&self) -> &Qwen2Config {
        &self.config
    }

    /// Computes every f32 matmul as four bf16-split products (see `mm`): about f32 accuracy on
    /// burn's CUDA backend, whose matmuls otherwise round f32 operands to TF32 (10-bit
    /// mantissa; logits move by about 7e-3 on the parity model), at four times the matmul cost.
    /// Off by default; `kevin policy parity` turns it on for f32 on CUDA. No effect in bf16.
    /// Needs a backend with bf16 casts (not NdArray, whose f32 matmuls are exact anyway).
    pub fn set_split_f32_matmul(&mut self, on: bool) {
        self.split = on;
        for layer in &mut self.layers {
            layer.self_attn.split = on;
            layer.mlp.split = on;
        }
    }

    /// A cache of `slots` x `max_len` tokens; with `fused`, on the fused path where it serves
    /// ([`fused`]), otherwise (or where it cannot start) burn's layers, the reference.
    /// [`CausalLm::new_cache`] asks for the fused path when [`fused::SWITCH`] is on.
    pub fn cache_for(&self, slots: usize, max_len: usize, fused: bool) -> Qwen2Cache<B> {
        let cfg = &self.config;
        if fused && fused::serves::<B>() {
            let device: Box<dyn std::any::Any> = Box::new(self.device());
            let index = device
                .downcast_ref::<burn::backend::cuda::CudaDevice>()
                .map_or(0, |d| d.index);
            match fused::Fused::new(cfg, slots, max_len, self.dtype(), index) {
                Ok(engine) => {
                    return Qwen2Cache {
                        layers: Vec::new(),
                        lens: vec![0; slots],
                        max_len,
                        bucketed: false,
                        fused: Some(engine),
                    }
                }
                Err(why) => {
                    static ONCE: std::sync::Once = std::sync::Once::new();
                    ONCE.call_once(|| {
                        tracing::warn!(
                            "the fused extend path is unavailable, burn's layers run instead: {why}"
                        );
                    });
                }
            }
        }
        let shape = [slots * cfg.num_key_value_heads * max_len, cfg.head_dim()];
        let device = self.device();
        let layers = (0..cfg.num_hidden_layers)
            .map(|_| LayerKv {
                k: Tensor::zeros(shape, (&device, super::float_dtype::<B>())),
                v: Tensor::zeros(shape, (&device, super::float_dtype::<B>())),
            })
            .collect();
        Qwen2Cache {
            layers,
            lens: vec![0; slots],
            max_len,
            bucketed: compiles_per_shape::<B>(&device),
            fused: None,
        }
    }

    /// Refuses an `extend` call's rows that cannot run (see [`CausalLm::extend`]); which slots
    /// the call touches.
    fn check_rows(
        &self,
        cache: &Qwen2Cache<B>,
        slots: &[usize],
        tokens: &[Vec<u32>],
    ) -> Result<Vec<bool>, String> {
        let cfg = &self.config;
        if slots.len() != tokens.len() {
            return Err(format!(
                "extend: {} slots for {} token rows",
                slots.len(),
                tokens.len()
            ));
        }
        if slots.is_empty() {
            return Err("extend: no rows".into());
        }
        let mut seen = vec![false; cache.slots()];
        for (row, (&slot, toks)) in slots.iter().zip(tokens).enumerate() {
            if slot >= cache.slots() {
                return Err(format!(
                    "slot {slot} (row {row}): the cache has {} slots",
                    cache.slots()
                ));
            }
            if std::mem::replace(&mut seen[slot], true) {
                return Err(format!(
                    "slot {slot} (row {row}): appears twice in one extend"
                ));
            }
            if toks.is_empty() {
                return Err(format!("slot {slot} (row {row}): no new tokens"));
            }
            if cache.lens[slot] + toks.len() > cache.max_len {
                return Err(format!(
                    "slot {slot}: {} cached + {} new tokens pass the slot's max_len {}",
                    cache.lens[slot],
                    toks.len(),
                    cache.max_len
                ));
            }
            if let Some(&bad) = toks.iter().find(|&&tok| tok as usize >= cfg.vocab_size) {
                return Err(format!(
                    "slot {slot} (row {row}): token {bad} is outside the vocabulary of {}",
                    cfg.vocab_size
                ));
            }
        }
        Ok(seen)
    }

    /// `[.., hidden] -> [.., vocab]`
    fn logits<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        match &self.lm_head {
            Some(head) => lin(head, x, self.split),
            None => on_rows(x, |x| {
                let w = self.embed_tokens.weight.val();
                let [vocab, hidden] = w.dims();
                let cublas = crate::cublas::wants_dims::<B>(
                    x.dtype(),
                    &x.dims(),
                    w.dtype(),
                    &[hidden, vocab],
                );
                if self.split || cublas {
                    mm(x, w.transpose(), self.split)
                } else {
                    linear(x, w.transpose(), None)
                }
            }),
        }
    }
}

/// `masked [rows, 1, t, s]`: true where key position `k` comes after the query's position, i.e.
/// where a query (at `query_pos [rows, t]`) may not look.
pub(super) fn causal_mask<B: Backend>(
    query_pos: Tensor<B, 2, Int>,
    keys: usize,
) -> Tensor<B, 4, Bool> {
    let [rows, t] = query_pos.dims();
    let device = query_pos.device();
    let key_pos = Tensor::<B, 1, Int>::arange(0..keys as i64, &device).reshape([1, 1, 1, keys]);
    let query_pos = query_pos.reshape([rows, 1, t, 1]);
    key_pos
        .expand([rows, 1, t, keys])
        .greater(query_pos.expand([rows, 1, t, keys]))
}

impl<B: Backend> CausalLm<B> for Qwen2<B> {
    type Cache = Qwen2Cache<B>;

    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    fn max_positions(&self) -> usize {
        self.config.max_position_embeddings
    }

    fn device(&self) -> B::Device {
        self.embed_tokens.weight.device()
    }

    fn new_cache(&self, slots: usize, max_len: usize) -> Qwen2Cache<B> {
        self.cache_for(slots, max_len, fused::SWITCH.get())
    }

    fn extend(
        &self,
        cache: &mut Qwen2Cache<B>,
        slots: &[usize],
        tokens: &[Vec<u32>],
    ) -> Result<Tensor<B, 2>, String> {
        let seen = self.check_rows(cache, slots, tokens)?;
        let cfg = &self.config;
        if let Some(engine) = &mut cache.fused {
            let pass = fused::Pass::new(&cache.lens, slots, tokens);
            let logits = fused::extend(self, engine, &pass)?;
            cache.advance(slots, tokens);
            return Ok(logits);
        }
        let device = self.device();
        let real_rows = slots.len();
        let (kv, max_len) = (cfg.num_key_value_heads, cache.max_len);
        let mut t = tokens.iter().map(Vec::len).max().unwrap_or(1);
        let mut keys = slots
            .iter()
            .zip(tokens)
            .map(|(&s, toks)| cache.lens[s] + toks.len())
            .max()
            .unwrap_or(1);
        // Padding rows (bucketed shapes only): one query each, in a slot this call does not
        // touch, at that slot's length; nothing is written for them and their logits dropped.
        let mut all_slots = slots.to_vec();
        if cache.bucketed {
            let rows = real_rows.next_power_of_two().min(cache.slots());
            all_slots.extend(
                (0..cache.slots())
                    .filter(|&s| !seen[s])
                    .take(rows - real_rows),
            );
            if t > 1 {
                t = round_up(t, TOKEN_BUCKET, usize::MAX);
            }
            keys = round_up(keys, KEY_BUCKET, max_len);
        }
        let rows = all_slots.len();
        // Rows are right-padded to `t` with token 0; a padded query sits at the position after
        // its row's last token, sees only keys up to there (never a fully masked row, so no NaN)
        // and its output is dropped. Real queries never see a padded key: it comes after them.
        let mut ids = Vec::with_capacity(rows * t);
        let mut positions = Vec::with_capacity(rows * t);
        let (mut src, mut dst) = (Vec::new(), Vec::new());
        for (row, &slot) in all_slots.iter().enumerate() {
            let toks: &[u32] = tokens.get(row).map_or(&[], Vec::as_slice);
            let start = cache.lens[slot];
            for j in 0..t {
                ids.push(toks.get(j).map_or(0, |&tok| tok as i64));
                positions.push(start + j);
            }
            for head in 0..kv {
                for j in 0..toks.len() {
                    src.push(((row * kv + head) * t + j) as i64);
                    dst.push(((slot * kv + head) * max_len + start + j) as i64);
                }
            }
        }
        let written = src.len();
        let query_pos = int_tensor::<B, 2>(
            positions.iter().map(|&p| p as i64).collect(),
            [rows, t],
            &device,
        );
        // Cache row of (row, head, key) = (slot * kv + head) * max_len + key: each (row, head)'s
        // base plus 0..keys, added on the device.
        let bases = all_slots
            .iter()
            .flat_map(|&slot| (0..kv).map(move |head| ((slot * kv + head) * max_len) as i64))
            .collect();
        let read = int_tensor::<B, 2>(bases, [rows * kv, 1], &device)
            + Tensor::<B, 1, Int>::arange(0..keys as i64, &device).reshape([1, keys]);
        let plan = ExtendPlan {
            read: read.reshape([rows * kv * keys]),
            src: int_tensor(src, [written], &device),
            dst: int_tensor(dst, [written], &device),
            keys,
            masked: causal_mask(query_pos, keys),
            rope: Rope::new(cfg, &positions, rows, &device),
        };

        let mut x = self
            .embed_tokens
            .forward(int_tensor(ids, [rows, t], &device));
        let old = std::mem::take(&mut cache.layers);
        for (layer, kv) in self.layers.iter().zip(old) {
            let mut updated = None;
            x = layer.forward(x, |attn, x| {
                let (out, kv) = attn.forward_cached(x, &plan, kv);
                updated = Some(kv);
                out
            });
            cache.layers.extend(updated);
        }
        cache.advance(slots, tokens);

        // The hidden state of each real row's last token: [rows * t, hidden] -> [real, hidden].
        let last: Vec<i64> = tokens
            .iter()
            .enumerate()
            .map(|(row, toks)| (row * t + toks.len() - 1) as i64)
            .collect();
        let [_, _, hidden] = x.dims();
        let x = x
            .reshape([rows * t, hidden])
            .select(0, int_tensor(last, [real_rows], &device));
        Ok(to_f32(self.logits(self.norm.forward(x))))
    }

    fn extend_draw(
        &self,
        cache: &mut Qwen2Cache<B>,
        slots: &[usize],
        tokens: &[Vec<u32>],
        draws: &[crate::DeviceDraw],
    ) -> Result<Option<Vec<(u32, f32)>>, String> {
        if cache.fused.is_none() {
            return Ok(None);
        }
        self.check_rows(cache, slots, tokens)?;
        if draws.len() != slots.len() {
            return Err(format!("{} draws for {} rows", draws.len(), slots.len()));
        }
        let pass = fused::Pass::new(&cache.lens, slots, tokens);
        let engine = cache.fused.as_mut().expect("checked above");
        let drawn = fused::draw(self, engine, &pass, draws)?;
        cache.advance(slots, tokens);
        Ok(Some(drawn))
    }

    fn clear_slot(&self, cache: &mut Qwen2Cache<B>, slot: usize) {
        let len = std::mem::replace(&mut cache.lens[slot], 0);
        // The fused path reads only a slot's first `len` positions: nothing to restore.
        if len == 0 || cache.fused.is_some() {
            return;
        }
        // Restore the zeros that the indexed-add write relies on (see `LayerKv`): the first
        // `len` positions of each of the slot's heads. The tensors are moved, not cloned, so a
        // backend may fill them in place.
        let (kv, max_len) = (self.config.num_key_value_heads, cache.max_len);
        let d = self.config.head_dim();
        cache.layers = std::mem::take(&mut cache.layers)
            .into_iter()
            .map(|mut layer| {
                for head in 0..kv {
                    let start = (slot * kv + head) * max_len;
                    let region = [start..start + len, 0..d];
                    layer.k = layer.k.slice_fill(region.clone(), 0.0);
                    layer.v = layer.v.slice_fill(region, 0.0);
                }
                layer
            })
            .collect();
    }

    fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let [b, t] = tokens.dims();
        let device = tokens.device();
        let positions: Vec<usize> = (0..t).collect();
        let rope = Rope::new(&self.config, &positions, 1, &device);
        // Built before the layers even where flash attention needs none: built lazily inside the
        // first layer instead (e1551c9), burn's fusion (0.21) failed to generate a kernel of the
        // learner's step on CUDA (an index past a fused block's inputs), with flash on or off.
        // `qwen2_gpu.rs` runs whole learner steps on CUDA for this.
        let query_pos = Tensor::<B, 1, Int>::arange(0..t as i64, &device).reshape([1, t]);
        let masked = causal_mask(query_pos, t);
        // The learner's pass: kevin's embedding gradient on CUDA (`norm::embedding`).
        let mut x = match crate::norm::embedding(self.embed_tokens.weight.val(), tokens) {
            Ok(x) => x,
            Err((_, tokens)) => self.embed_tokens.forward(tokens),
        };
        for layer in &self.layers {
            x = layer.forward(x, |attn, x| attn.forward(x, &rope, masked.clone()));
        }
        debug_assert_eq!(x.dims()[0], b);
        self.logits(self.norm.forward(x))
    }
}
